"""Checkpoints of the full training state: atomic, verified, rotating.

The trainer saves where its pipeline is drained. The state is a set of groups (one per model
block) of large flat CPU tensors (fp32 master weights, AdamW moments; ~36 GB for a 3B model) plus
a small JSON-able `meta` (step, optimizer config, data position, RNG state, model identity). At
that size a serialised copy in RAM is not affordable, so bytes go straight from each tensor's
memory to its file and back, CRC32-checked on the same 64 MiB chunks, one group per thread
(zlib.crc32 and os.write, os.pwrite and readinto release the GIL).

Format, one directory per checkpoint, `root/step-{step:09d}/`:
- `{group}.bin`: the group's tensors' raw bytes back to back, each starting at a multiple of 4096;
- the `link_files`, hard-linked (copied where the filesystem refuses) under their given names;
- `manifest.json`, written last: format, version, step, meta, per group its file's size and
  tensors (name, dtype, shape, offset, nbytes, crc32), per linked file its size and crc32.
meta goes through JSON: tuples come back as lists, dict keys as strings.

Atomicity: everything is written into `root/.tmp-step-{step:09d}-{pid}/`, every file fsynced,
then the manifest (fsynced), the directory fsynced, renamed to its final name, and root fsynced.
So a final-named directory holds a whole checkpoint unless something damaged it afterwards: it
is *complete* iff its manifest parses and its files exist with the recorded sizes. list() shows
complete ones only; load() and verify() of a damaged one raise CheckpointCorruptError, and
load_latest_good() treats it as corrupt (falls back or raises). A killed writer leaves only
`.tmp-*` directories: list() ignores them, the next save() deletes them (one writer per root).
Re-saving an existing step moves the old directory aside (`.tmp-old-...`) only once the new one
is complete; if a crash falls between the two renames, the next CheckpointStore puts it back.
Rotation deletes the oldest complete checkpoints beyond keep_last, never the one just saved.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from layerslide.executor import waits
from layerslide.executor.nvme import supports_direct
from layerslide.training.hf_io import fsync_path

FORMAT, VERSION = "layerslide-checkpoint", 1
ALIGN = 4096  # tensor starts are page-aligned: a reader may mmap them or use O_DIRECT
CHUNK = 64 << 20  # big enough for full disk speed; small enough for steady progress and stopping
SCRATCH = 4 << 20  # verify's read buffer: stays in cache for the CRC pass (2x faster than 64 MiB)
MANIFEST = "manifest.json"
MANIFEST_SLACK = 16 << 20  # room for the manifest (meta, RNG state) and filesystem rounding
_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,199}")  # no separators, no leading dot
_STEP_DIR = re.compile(r"step-([0-9]{9,})")
_OLD_DIR = re.compile(r"\.tmp-old-step-([0-9]{9,})-[0-9]+")

Progress = Callable[[int, int], None]
Groups = Mapping[str, Mapping[str, torch.Tensor]]


class GroupAccess:
    """How a save reaches its groups' tensors while the caller may go on changing them:
    claim(group) right before a group is written returns the tensors to write (the live ones
    or a copy), release(group) once its file is written. The default passes the live ones."""

    def claim(self, group: str, tensors: Mapping[str, torch.Tensor]
              ) -> Mapping[str, torch.Tensor]:
        return tensors

    def release(self, group: str) -> None:
        pass


class CheckpointError(Exception):
    """A checkpoint could not be written, found or read."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's files disagree with its manifest (checksum, size, format)."""


class CheckpointSpaceError(CheckpointError):
    """Not enough disk space for a checkpoint."""


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    path: Path
    step: int
    meta: dict
    total_bytes: int  # group and linked files


class _Run:
    """Progress across the worker threads of one save/load/verify, and their stop signal."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.progress, self.done = total, progress, 0
        self.lock, self.stop = threading.Lock(), threading.Event()

    def tick(self, n: int) -> None:
        if self.stop.is_set():  # another worker failed: stop early rather than finish in vain
            raise CheckpointError("stopped because another worker failed")
        if self.progress is not None:
            with self.lock:  # serialised, so the callback sees `done` only grow
                self.done += n
                self.progress(self.done, self.total)


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a safe file name: use letters, digits and "
                         "_ . + - only, not starting with '.', at most 200 characters")


def _check_tensors(groups: Groups, what: str) -> None:
    for g, tensors in groups.items():
        _check_name(g, "group name")
        for n, t in tensors.items():
            if not isinstance(n, str):
                raise TypeError(f"tensor names must be strings, not {n!r} in group {g}")
            if not (isinstance(t, torch.Tensor) and t.device.type == "cpu"
                    and t.layout == torch.strided and t.is_contiguous()):
                got = (f"a {t.layout} {t.device} tensor, strides {t.stride()}"
                       if isinstance(t, torch.Tensor) and t.layout == torch.strided
                       else repr(type(t)))
                raise ValueError(f"{what} tensor {g}/{n} must be a contiguous CPU tensor, not "
                                 f"{got}: pass t.contiguous() / t.cpu()")


def _bytes_of(t: torch.Tensor) -> memoryview:
    # numpy has no bf16: view as bytes first; reshape(-1) lets 0-d tensors be viewed too
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _file_size(tensors: Mapping[str, torch.Tensor]) -> int:
    size = 0
    for t in tensors.values():
        size += -size % ALIGN + t.nbytes
    return size


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


def _readinto_all(f, view: memoryview) -> int:
    got = 0
    while got < len(view) and (n := f.readinto(view[got:])):
        got += n
    return got


def _scratch() -> memoryview:
    return _bytes_of(torch.empty(SCRATCH, dtype=torch.uint8))


def _write_group(path: Path, group: str, live: Mapping[str, torch.Tensor], run: _Run,
                 access: GroupAccess, direct: bool = False) -> dict:
    """One group's file. With `direct`, the page-aligned whole pages of a page-aligned tensor
    (a checkpoint copy's) go to the disk with O_DIRECT: through the page cache they cost a
    second copy of the state in host memory bandwidth, beside training. Pads are left as
    holes (they read as zeros)."""
    entries, offset, fd, direct_fd = [], 0, None, None
    try:
        tensors = access.claim(group, live)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        if direct and any(t.data_ptr() % ALIGN == 0 for t in tensors.values()):
            direct_fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        for name, t in tensors.items():
            offset += -offset % ALIGN
            view, crc = _bytes_of(t), 0
            aligned = direct_fd is not None and t.data_ptr() % ALIGN == 0
            for i in range(0, len(view), CHUNK):
                chunk = view[i:i + CHUNK]
                crc = zlib.crc32(chunk, crc)
                whole = len(chunk) - len(chunk) % ALIGN if aligned else 0
                done = _pwrite_direct(direct_fd, chunk[:whole], offset + i) if whole else 0
                if done < whole:  # the filesystem refused O_DIRECT here: buffered from now on
                    aligned = False
                if done < len(chunk):
                    _pwrite_all(fd, chunk[done:], offset + i + done)
                run.tick(len(chunk))
            entries.append({"name": name, "dtype": _dtype(t.dtype), "shape": list(t.shape),
                            "offset": offset, "nbytes": len(view), "crc32": crc})
            offset += len(view)
        os.ftruncate(fd, offset)  # a group ending in a pad (an empty tensor) keeps its size
        os.fsync(fd)
    except OSError as e:
        e.filename = e.filename or str(path)  # os.pwrite's errors do not name the file
        raise
    finally:
        for handle in (direct_fd, fd):
            if handle is not None:
                os.close(handle)
        access.release(group)
    return {"file": path.name, "size": offset, "tensors": entries}


def _pwrite_direct(fd: int, data: memoryview, offset: int) -> int:
    """Write what O_DIRECT takes of `data` (whole pages at a page-aligned offset); returns the
    bytes written, short where a write came back short of a page or was refused (EINVAL: a
    filesystem that took the probe but not this write) and the rest must go buffered."""
    done = 0
    while done < len(data):
        try:
            written = os.pwrite(fd, data[done:], offset + done)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return done
            raise
        done += written
        if written == 0 or written % ALIGN:
            return done - written % ALIGN if written else done  # the next write must be aligned
    return done


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _crc_file(path: Path, run: _Run) -> tuple[int, int]:
    buf, crc, size = _scratch(), 0, 0
    with open(path, "rb", buffering=0) as f:
        while n := _readinto_all(f, buf):
            crc, size = zlib.crc32(buf[:n], crc), size + n
            run.tick(n)
    return size, crc


def _link(src: Path, dst: Path, run: _Run) -> dict:
    try:
        os.link(src, dst)  # no copy; the caller must replace src by rename, never edit it in place
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
    fsync_path(dst)  # a linked file's data may not have reached the disk yet either
    size, crc = _crc_file(dst, run)
    return {"size": size, "crc32": crc}


def _corrupt(path: Path, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{what}: the checkpoint {path.parent} is damaged; resume from "
                                  "an earlier one (`layerslide train --resume-fallback`, or "
                                  "load_latest_good(fallback=True)) or delete it")


def _read_group(path: Path, entry: dict, into: Mapping[str, torch.Tensor] | None, run: _Run,
                check: bool) -> None:
    """Reads a group file into `into` (None: a scratch buffer, for verify), checking CRCs."""
    scratch = _scratch() if into is None else None
    step = CHUNK if into is not None else SCRATCH
    try:
        with open(path, "rb", buffering=0) as f:
            for te in entry["tensors"]:
                f.seek(te["offset"])
                view, crc = (_bytes_of(into[te["name"]]) if into is not None else None), 0
                for pos in range(0, te["nbytes"], step):
                    n = min(step, te["nbytes"] - pos)
                    chunk = view[pos:pos + n] if view is not None else scratch[:n]
                    if _readinto_all(f, chunk) != n:
                        raise _corrupt(path, f"{path} ends inside tensor {te['name']!r}")
                    crc = zlib.crc32(chunk, crc) if check else crc
                    run.tick(n)
                if check and crc != te["crc32"]:
                    raise _corrupt(path, f"tensor {te['name']!r} in {path} fails its CRC32 check "
                                         f"(manifest {te['crc32']:08x}, data {crc:08x})")
    except OSError as e:
        raise _corrupt(path, f"cannot read {path}: {e}") from e


def _check_link(path: Path, entry: dict, run: _Run) -> None:
    try:
        size, crc = _crc_file(path, run)
    except OSError as e:
        raise _corrupt(path, f"cannot read {path}: {e}") from e
    if (size, crc) != (entry["size"], entry["crc32"]):
        raise _corrupt(path, f"linked file {path} fails its CRC32 check (manifest "
                             f"{entry['crc32']:08x}, data {crc:08x}; was its source edited?)")


def _mismatches(manifest: dict, into: Groups) -> list[str]:
    stored = {g: {t["name"]: t for t in e["tensors"]} for g, e in manifest["groups"].items()}
    out = [f"group {g!r} is in the checkpoint only" for g in stored.keys() - into.keys()]
    out += [f"group {g!r} is not in the checkpoint" for g in into.keys() - stored.keys()]
    for g in stored.keys() & into.keys():
        have, want = stored[g], into[g]
        out += [f"{g}/{n} is in the checkpoint only" for n in have.keys() - want.keys()]
        out += [f"{g}/{n} is not in the checkpoint" for n in want.keys() - have.keys()]
        for n in have.keys() & want.keys():
            s, t = have[n], want[n]
            if (s["dtype"], s["shape"]) != (_dtype(t.dtype), list(t.shape)):
                out.append(f"{g}/{n} is {s['dtype']}{s['shape']} in the checkpoint, "
                           f"{_dtype(t.dtype)}{list(t.shape)} here")
    return sorted(out)


def holds_checkpoints(root: str | Path) -> bool:
    """Whether a folder holds any step folder, complete or not (nothing is made or changed)."""
    root = Path(root)
    return root.is_dir() and any(_STEP_DIR.fullmatch(p.name) and p.is_dir()
                                 for p in root.iterdir())


class CheckpointStore:
    """Checkpoints under one root directory; see the module docstring. One writer per root.

    `progress(done_bytes, total_bytes)` callbacks run on the worker threads, one call at a time
    per chunk (64 MiB; 4 MiB in verify): they must be thread-safe towards the caller's state
    (not assume the calling thread) and quick. An exception from one aborts the save or load.
    """

    def __init__(self, root: str | Path, *, keep_last: int = 2, writer_threads: int = 4,
                 direct_writes: bool = True, read_only: bool = False):
        if keep_last < 1 or writer_threads < 1:
            raise ValueError(f"keep_last ({keep_last}) and writer_threads ({writer_threads}) "
                             "must be at least 1")
        self.root, self.keep_last, self.writer_threads = Path(root), keep_last, writer_threads
        self.direct_writes = direct_writes  # page-aligned tensors skip the page cache
        if read_only:  # a reader (an export) changes nothing, and may read from read-only media
            if not self.root.is_dir():
                raise CheckpointError(f"{self.root} is not a folder of checkpoints")
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.close((probe := tempfile.mkstemp(dir=self.root, prefix=".tmp-probe-"))[0])
            os.unlink(probe[1])  # a real write catches permissions, ACLs and read-only mounts
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoints to {self.root}: {e}; fix its "
                                  "permissions or pass another --checkpoint-dir") from e
        for p in self.root.iterdir():  # a crash between a re-save's two renames
            if (m := _OLD_DIR.fullmatch(p.name)) and not (self.root / f"step-{m[1]}").exists():
                os.rename(p, self.root / f"step-{m[1]}")

    def required_bytes(self, groups: Groups, *, link_files: Mapping[str, Path] | None = None
                       ) -> int:
        """Bytes the group files take, plus linked files that must be copied (other device)."""
        _check_tensors(groups, "saved")
        root_dev = os.stat(self.root).st_dev
        copied = [os.stat(p) for p in (link_files or {}).values()]
        return (sum(_file_size(t) for t in groups.values())
                + sum(s.st_size for s in copied if s.st_dev != root_dev))

    def check_space(self, groups: Groups, *, link_files: Mapping[str, Path] | None = None
                    ) -> None:
        need = self.required_bytes(groups, link_files=link_files) + MANIFEST_SLACK
        free = shutil.disk_usage(self.root).free
        if need > free:
            raise CheckpointSpaceError(
                f"a checkpoint needs {need} bytes ({need / 1e9:.2f} GB) but {self.root} has "
                f"{free} bytes ({free / 1e9:.2f} GB) free: free space there, pass another "
                f"--checkpoint-dir, or keep fewer checkpoints (now keep_last={self.keep_last})")

    def save(self, step: int, groups: Groups, meta: dict, *,
             link_files: Mapping[str, Path] | None = None,
             progress: Progress | None = None,
             access: GroupAccess | None = None) -> CheckpointInfo:
        """Writes a complete checkpoint of `groups` (contiguous CPU tensors, left unchanged
        until this returns, or until `access` releases them), then rotates; groups are
        written in their order, writer_threads at a time. Raises before writing on bad input or too little
        space; on a failed write deletes the partial one (earlier checkpoints stay intact).

        `link_files` {name: source} are hard-linked where possible: the checkpoint then shares
        the source's data, so the caller must replace those files (write new, rename), never
        edit them in place, or the checkpoint changes with them (verify() would notice)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, not {step!r}")
        links = {name: Path(src) for name, src in (link_files or {}).items()}
        for name, src in links.items():
            _check_name(name, "link_files name")
            if name == MANIFEST or name in {f"{g}.bin" for g in groups} or not src.is_file():
                raise ValueError(f"link_files {name!r} -> {src}: the name must not clash with "
                                 f"{MANIFEST} or a group file, and the source must be a file")
        try:
            if not isinstance(meta, dict):
                raise TypeError(f"it is a {type(meta).__name__}, not a dict")
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"meta is not JSON-serialisable ({e}): store tensors and numpy "
                             "values as lists, ints and floats") from e
        for p in self.root.glob(".tmp-*"):  # a killed writer's leftovers (or a failed rotation)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        self.check_space(groups, link_files=links)
        pid = os.getpid()
        tmp, final = self.root / f".tmp-step-{step:09d}-{pid}", self.root / f"step-{step:09d}"
        old = self.root / f".tmp-old-step-{step:09d}-{pid}"
        total = sum(t.nbytes for ts in groups.values() for t in ts.values())
        run = _Run(total + sum(p.stat().st_size for p in links.values()), progress)
        try:
            tmp.mkdir()
            access = access or GroupAccess()
            direct = self.direct_writes and supports_direct(tmp)
            jobs = [partial(_write_group, tmp / f"{g}.bin", g, ts, run, access, direct)
                    for g, ts in groups.items()]
            jobs += [partial(_link, src, tmp / name, run) for name, src in links.items()]
            done = self._parallel(jobs, run)
            manifest = {"format": FORMAT, "version": VERSION, "step": step, "meta": meta,
                        "groups": dict(zip(groups, done[:len(groups)], strict=True)),
                        "links": dict(zip(links, done[len(groups):], strict=True))}
            fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, memoryview(json.dumps(manifest).encode()))
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_path(tmp)
            if final.exists():  # replaced only now that the new one is complete
                os.rename(final, old)
            os.rename(tmp, final)
            fsync_path(self.root)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not final.exists():
                os.rename(old, final)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CheckpointSpaceError(
                    f"disk full writing checkpoint {tmp} ({e}); it was deleted, earlier ones "
                    "are intact: free space there, pass another --checkpoint-dir, or keep fewer "
                    f"checkpoints (now keep_last={self.keep_last})") from e
            if isinstance(e, OSError):
                raise CheckpointError(f"writing checkpoint {tmp} failed ({e}); it was deleted, "
                                      "earlier ones are intact") from e
            raise
        shutil.rmtree(old, ignore_errors=True)
        self._rotate(keep=final)
        return self._info(final)

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        infos = []
        for _, path in self._step_dirs():
            try:
                infos.append(self._info(path))
            except CheckpointCorruptError:
                continue
        return infos

    def latest(self) -> CheckpointInfo | None:
        return (self.list() or [None])[-1]

    def verify(self, info_or_path: CheckpointInfo | str | Path, *,
               progress: Progress | None = None) -> None:
        """Re-reads every file and checks sizes and CRC32s; raises CheckpointCorruptError."""
        path = self._path(info_or_path)
        manifest = self._manifest(path)
        self._read_all(path, manifest, None, True, progress)

    def load(self, info_or_path: CheckpointInfo | str | Path, into: Groups, *,
             verify: bool = True, progress: Progress | None = None) -> dict:
        """Reads the stored tensors into `into`'s tensors, which must match them exactly in
        names, dtypes and shapes (ValueError listing the differences). Returns meta. After a
        CheckpointCorruptError `into` is partly overwritten: load another checkpoint into it."""
        path = self._path(info_or_path)
        manifest = self._manifest(path)
        _check_tensors(into, "destination")
        if problems := _mismatches(manifest, into):
            more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
            raise ValueError(f"checkpoint {path} does not fit the tensors to load into: "
                             f"{'; '.join(problems[:20])}{more}: resume with the model and "
                             "settings that saved it, or use another --checkpoint-dir")
        self._read_all(path, manifest, into, verify, progress)
        return manifest["meta"]

    def load_latest_good(self, into: Groups, *, fallback: bool,
                         progress: Progress | None = None) -> tuple[CheckpointInfo, dict]:
        """Loads the newest checkpoint (damaged ones included: they are not skipped silently);
        if it is corrupt, warns and tries the one before when `fallback`, else raises. Damaged
        ones passed over are renamed damaged-step-N once an older one has loaded."""
        dirs = self._step_dirs()
        if not dirs:
            raise CheckpointError(f"no checkpoint in {self.root}")
        error, skipped = None, []
        for _, path in reversed(dirs):
            try:
                meta = self.load(path, into, progress=progress)
            except CheckpointCorruptError as e:
                if not fallback:
                    raise
                warnings.warn(f"skipping checkpoint {path}: {e}", RuntimeWarning, stacklevel=2)
                error = e
                skipped.append(path)
                continue
            for damaged in skipped:  # out of this run's way: else they stay the newest
                self._set_aside(damaged)
            return self._info(path), meta
        raise CheckpointCorruptError(f"all {len(dirs)} checkpoints in {self.root} are "
                                     "damaged") from error

    def holds_checkpoints(self) -> bool:
        """Whether any step folder is here, complete or not (another run's, say)."""
        return holds_checkpoints(self.root)

    def read_tensor(self, info_or_path: CheckpointInfo | str | Path, group: str,
                    name: str) -> torch.Tensor:
        """One stored tensor, its CRC32 checked (CheckpointCorruptError if it fails): an
        export reads a checkpoint a block at a time, not into the whole state."""
        path = self._path(info_or_path)
        entry = self._manifest(path)["groups"][group]
        stored = next(t for t in entry["tensors"] if t["name"] == name)
        out = torch.empty(stored["shape"], dtype=getattr(torch, stored["dtype"]))
        _read_group(path / entry["file"], {"tensors": [stored]}, {name: out},
                    _Run(stored["nbytes"], None), True)
        return out

    def stored(self, info_or_path: CheckpointInfo | str | Path,
               group: str) -> dict[str, tuple[torch.dtype, int]]:
        """Each stored tensor of a group: its dtype and element count (nothing read)."""
        entry = self._manifest(self._path(info_or_path))["groups"][group]
        return {t["name"]: (getattr(torch, t["dtype"]), _numel(t["shape"]))
                for t in entry["tensors"]}

    def linked_files(self, info_or_path: CheckpointInfo | str | Path) -> dict[str, Path]:
        """The checkpoint's linked files (NVMe state), each checked against its CRC32."""
        path = self._path(info_or_path)
        links = self._manifest(path)["links"]
        run = _Run(sum(e["size"] for e in links.values()), None)
        for name, entry in links.items():
            _check_link(path / name, entry, run)
        return {name: path / name for name in links}

    def _set_aside(self, path: Path) -> None:
        """Rename a damaged checkpoint out of the step folders: a run resumed from an older
        one would otherwise name it as the newest, and its rotation keep it over good ones."""
        aside = path.with_name(f"damaged-{path.name}")
        try:
            os.rename(path, aside)
        except OSError as e:
            warnings.warn(f"could not set damaged checkpoint {path} aside: {e}", RuntimeWarning,
                          stacklevel=3)
            return
        warnings.warn(f"damaged checkpoint {path} set aside as {aside.name} (delete it once "
                      "inspected)", RuntimeWarning, stacklevel=3)

    def _path(self, info_or_path: CheckpointInfo | str | Path) -> Path:
        return info_or_path.path if isinstance(info_or_path, CheckpointInfo) else Path(
            info_or_path)

    def _step_dirs(self) -> list[tuple[int, Path]]:
        return sorted((int(m[1]), p) for p in self.root.iterdir()
                      if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir())

    def _manifest(self, path: Path) -> dict:
        """The manifest, once the files it lists are there with their sizes."""
        mpath = path / MANIFEST
        try:
            m = json.loads(mpath.read_bytes())
            if (m["format"], m["version"]) != (FORMAT, VERSION):
                raise ValueError(f"{m['format']} version {m['version']}, this reader reads "
                                 f"{FORMAT} version {VERSION}")
            sizes = {e["file"]: e["size"] for e in m["groups"].values()}
            sizes |= {name: e["size"] for name, e in m["links"].items()}
            if not isinstance(m["step"], int) or not isinstance(m["meta"], dict):
                raise TypeError("step is not an int or meta not a dict")
            for name in sizes:
                _check_name(name, "file")
        except FileNotFoundError as e:
            raise _corrupt(mpath, f"{mpath} is missing") from e
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _corrupt(mpath, f"{mpath} is unreadable or malformed ({e!r})") from e
        for name, size in sizes.items():
            f = path / name
            actual = f.stat().st_size if f.is_file() else None
            if actual != size:
                found = "missing" if actual is None else f"{actual} bytes"
                raise _corrupt(f, f"{f} is {found}, its manifest says {size} bytes")
        return m

    def _info(self, path: Path) -> CheckpointInfo:
        m = self._manifest(path)
        total = sum(e["size"] for e in [*m["groups"].values(), *m["links"].values()])
        return CheckpointInfo(path=path, step=m["step"], meta=m["meta"], total_bytes=total)

    def _read_all(self, path: Path, m: dict, into: Groups | None, check: bool,
                  progress: Progress | None) -> None:
        total = sum(t["nbytes"] for e in m["groups"].values() for t in e["tensors"])
        links = m["links"] if check else {}
        run = _Run(total + sum(e["size"] for e in links.values()), progress)
        jobs = [partial(_read_group, path / e["file"], e, None if into is None else into[g], run,
                        check) for g, e in m["groups"].items()]
        self._parallel(jobs + [partial(_check_link, path / n, e, run) for n, e in links.items()],
                       run)

    def _parallel(self, jobs: list[Callable[[], object]], run: _Run) -> list:
        with ThreadPoolExecutor(self.writer_threads) as pool:
            futures = [pool.submit(job) for job in jobs]
            try:
                done = waits.wait_first_exception(futures)
            except BaseException:  # e.g. Ctrl-C: make the workers stop at their next chunk
                run.stop.set()
                raise
            failed = [f.exception() for f in done if f.exception() is not None]
            if failed:
                run.stop.set()
                for f in futures:
                    f.cancel()
                raise failed[0]
        return [f.result() for f in futures]

    def _rotate(self, keep: Path) -> None:
        infos = [i for i in self.list() if i.path != keep]
        for info in infos[:max(0, len(infos) - (self.keep_last - 1))]:
            doomed = self.root / f".tmp-del-{info.path.name}-{os.getpid()}"
            try:  # out of sight first, so a crash mid-delete leaves no half checkpoint
                os.rename(info.path, doomed)
                shutil.rmtree(doomed)
            except OSError as e:
                warnings.warn(f"could not delete old checkpoint {info.path}: {e}",
                              RuntimeWarning, stacklevel=3)


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
