"""One logical file striped evenly over several folders (one per drive), read and written on
all of them at once: folder i holds bytes [i * S, (i + 1) * S) of it, S the file's size over the
folder count rounded up to O_DIRECT's 4 KiB (the last stripes may be short or empty). With one
folder the file is a plain file of its own name.

A write goes to a new file per stripe; once every stripe is written they replace the old ones
(os.replace), so a write that fails (a full disk) leaves the previous file whole, and a
checkpoint may hard-link the stripes instead of copying them.
"""

from __future__ import annotations

import errno
import os
import shutil
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch

ALIGN = 4096
CHUNK_BYTES = 64 << 20  # one read or write call moves at most this much


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def read_fully(fd: int, view: memoryview, offset: int = 0) -> int:
    """Read into the whole view from offset on, in calls of at most CHUNK_BYTES; the bytes read
    (fewer only where the file ended)."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:done + CHUNK_BYTES]], offset + done)
        if got <= 0:
            break
        done += got
    return done


def write_fully(fd: int, view: memoryview) -> None:
    """Write the whole view at the file's start, in calls of at most CHUNK_BYTES."""
    done = 0
    while done < len(view):
        wrote = os.pwritev(fd, [view[done:done + CHUNK_BYTES]], done)
        if wrote <= 0:  # a disk that takes nothing more (pwritev raises ENOSPC first, mostly)
            raise OSError(errno.ENOSPC, f"the disk took no more after {done} bytes")
        done += wrote


def stripe_ranges(nbytes: int, stripes: int) -> list[tuple[int, int]]:
    """The [start, end) bytes of a file of nbytes each of `stripes` folders holds."""
    size = padded(-(-nbytes // stripes))
    return [(min(i * size, nbytes), min((i + 1) * size, nbytes)) for i in range(stripes)]


class StripedFile:
    """A file of `nbytes` named `name`, striped over `folders` (direct[i]: whether folder i's
    filesystem takes O_DIRECT); `pools` (reads', writes') run the stripes' calls at once, a
    pool per direction so that a read never queues behind a write's stripes (None: in turn)."""

    def __init__(self, folders: list[Path], name: str, nbytes: int, direct: list[bool],
                 pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None):
        n = len(folders)
        self.nbytes, self.direct, self.pools = nbytes, direct, pools
        self.ranges = stripe_ranges(nbytes, n)
        stem, suffix = os.path.splitext(name)
        self.paths = [folder / (name if n == 1 else f"{stem}.s{i}{suffix}")
                      for i, folder in enumerate(folders)]

    def create(self) -> None:
        """Fresh zeros (sparse files), put in by replace like every write here."""
        for path, (lo, hi) in zip(self.paths, self.ranges, strict=True):
            fresh = path.with_suffix(".next")
            with open(fresh, "wb") as f:
                f.truncate(hi - lo)
            os.replace(fresh, path)

    def read(self, buffer: torch.Tensor, offset: int, nbytes: int) -> None:
        """Bytes [offset, offset + nbytes) of the file into buffer[:nbytes] (uint8; page-aligned
        where O_DIRECT is used, as are offset and every stripe's start)."""
        view = memoryview(buffer.numpy())
        jobs = []
        for i, (lo, hi) in enumerate(self.ranges):
            a, b = max(lo, offset), min(hi, offset + nbytes)
            if a < b:
                jobs.append((i, view[a - offset:b - offset], a - lo))
        self._run(0, self._read_stripe, jobs)

    def write(self, buffer: torch.Tensor) -> None:
        """The whole file from buffer[:nbytes]: each stripe to a new file, then all of them put
        in place. On failure the new files are removed and the old ones stay."""
        view = memoryview(buffer.numpy())
        jobs = [(i, view[lo:hi], 0) for i, (lo, hi) in enumerate(self.ranges)]
        try:
            self._run(1, self._write_stripe, jobs)
        except OSError:
            for path in self.paths:
                path.with_suffix(".next").unlink(missing_ok=True)
            raise
        for path in self.paths:
            os.replace(path.with_suffix(".next"), path)

    def remove(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)
            path.with_suffix(".next").unlink(missing_ok=True)

    def restore(self, sources: list[Path]) -> None:
        """Make copies of the stripes (a checkpoint's) the current ones: hard links where the
        filesystem allows (the file is never written in place, so the copies stay as they are)."""
        for path, source, (lo, hi) in zip(self.paths, sources, self.ranges, strict=True):
            if source.stat().st_size != hi - lo:
                raise ValueError(f"{source} holds {source.stat().st_size} bytes, this run's "
                                 f"{path.name} {hi - lo}: resume with the policy and NVMe "
                                 "folders that wrote the checkpoint")
        for path, source in zip(self.paths, sources, strict=True):
            fresh = path.with_suffix(".next")
            fresh.unlink(missing_ok=True)
            try:
                os.link(source, fresh)
            except OSError:  # another filesystem
                shutil.copyfile(source, fresh)
            os.replace(fresh, path)

    def _run(self, direction: int, fn, jobs: list) -> None:
        if self.pools is None or len(jobs) < 2:
            for job in jobs:
                fn(*job)
            return
        futures = [self.pools[direction].submit(fn, *job) for job in jobs]
        wait(futures)  # all of them over before a failure is raised (and files cleaned up)
        for future in futures:
            future.result()

    def _open(self, i: int, path: Path, flags: int) -> int:
        return os.open(path, flags | (os.O_DIRECT if self.direct[i] else 0), 0o644)

    def _read_stripe(self, i: int, view: memoryview, offset: int) -> None:
        fd = self._open(i, self.paths[i], os.O_RDONLY)
        try:
            done = read_fully(fd, view, offset)
        finally:
            os.close(fd)
        if done < len(view):
            raise OSError(errno.EIO, f"{self.paths[i]} ended after {offset + done} bytes of "
                          f"{offset + len(view)}: the NVMe state is damaged; resume from a "
                          "checkpoint")

    def _write_stripe(self, i: int, view: memoryview, _offset: int) -> None:
        fresh = self.paths[i].with_suffix(".next")
        fd = self._open(i, fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_fully(fd, view)
        finally:
            os.close(fd)
