"""The NVMe tier: the part of each block's optimizer state that the policy keeps on disk.

The plan's placement says how many of a block's first fp32 master weights, of its first
exp_avg and exp_avg_sq elements and of its first bf16 weights (round(fraction * n) of its n
parameters) live in the file `state_<block>.bin`, striped over the tier's folders, one per
drive (`stripes.StripedFile`: `state_<block>.s<i>.bin` in folder i) ([master part | moments
part] padded to 4 KiB, then [bf16 weights part] padded to 4 KiB), the rest in RAM. The moments
part holds the run's moment precision as `moments.Moments.layout` orders it (fp32: exp_avg
then exp_avg_sq). The plan reads a
block's state (not its weights: the update writes them all anew) into a staging buffer before
its optimizer step and writes the whole file back after; each read and write names its staging
buffer (placement.nvme_staging_slots of them, reused in the order the plan's edges allow). Before
each load of the block's weights the plan reads the weights part into a weight staging buffer
(placement.weight_staging_slots, page-locked), which the load copies to the GPU.

A write goes to a new file that then replaces the old one (os.replace), never into the old one:
a checkpoint can hard-link the files instead of copying them, and a write that fails (a full
disk) leaves the previous file whole. Reads and writes use O_DIRECT where the filesystem takes
it (no page-cache copy, no cache growth), page-aligned buffers and whole 4 KiB blocks.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from layerslide.executor.moments import Moments
from layerslide.executor.stripes import (
    ALIGN,
    StripedFile,
    padded,
    read_fully,
    stripe_ranges,
    write_fully,
)
from layerslide.planner.settings import MomentPrecision

# a state file's link held for a checkpoint being written (NvmeState.pin_files)
PIN_SUFFIX = ".pinned"


class NvmeSpaceError(OSError):
    """The disk has too little room, or the folder cannot be written."""


def aligned_buffer(nbytes: int) -> torch.Tensor:
    """A page-aligned uint8 host tensor (anonymous mmap), as O_DIRECT needs."""
    region = mmap.mmap(-1, max(padded(nbytes), ALIGN),
                       flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: not Shmem
    return torch.frombuffer(region, dtype=torch.uint8)


def nvme_folders(nvme_dir: str | Path | Sequence[str | Path]) -> list[Path]:
    """The tier's folders, one per drive: a path, a list of them, or (the command line's form)
    one string of comma-separated paths."""
    if isinstance(nvme_dir, str | Path):
        nvme_dir = [part.strip() for part in str(nvme_dir).split(",") if part.strip()]
    folders = [Path(folder).expanduser() for folder in nvme_dir]
    if not folders:
        raise ValueError("no NVMe folder given: pass --nvme-dir DIR (or DIR1,DIR2,... one per "
                         "drive)")
    if len({f.resolve() for f in folders}) != len(folders):
        raise ValueError(f"the NVMe folders {[str(f) for f in folders]} repeat one: give each "
                         "drive's folder once")
    return folders


class NvmeState:
    """Per-block state files striped over `folders` (one per drive), and the staging buffers
    the plan reads them into."""

    def __init__(self, folders: str | Path | Sequence[str | Path], master_numel: dict[int, int],
                 moments_numel: dict[int, int], staging_buffers: int, *,
                 weights_numel: dict[int, int] | None = None, weight_staging_buffers: int = 0,
                 pin=None, extra_bytes: int = 0, checkpoint_copies: int = 0,
                 moment_precision: MomentPrecision = "fp32"):
        self.folders = nvme_folders(folders)
        self.moment_precision = moment_precision
        self.master_numel = {b: k for b, k in master_numel.items() if k > 0}
        self.moments_numel = {b: k for b, k in moments_numel.items() if k > 0}
        self.weights_numel = {b: k for b, k in (weights_numel or {}).items() if k > 0}
        self.disk_blocks = sorted(set(self.master_numel) | set(self.moments_numel)
                                  | set(self.weights_numel))
        # where a block's bf16 weights part starts in its file: after its state, aligned
        self.state_bytes = {b: padded(4 * self.master_numel.get(b, 0) + Moments.nbytes_of(
                                       moment_precision, self.moments_numel.get(b, 0)))
                            for b in self.disk_blocks}
        self.file_bytes = {b: self.state_bytes[b] + padded(2 * self.weights_numel.get(b, 0))
                           for b in self.disk_blocks}
        # extra_bytes: what else the run keeps in each folder (activation checkpoints);
        # checkpoint_copies: checkpoints kept on these filesystems, each of which
        # ends up owning a copy of the files it hard-linked once the tier has replaced them
        n = len(self.folders)
        stripes = [stripe_ranges(size, n) for size in self.file_bytes.values()]
        for i, folder in enumerate(self.folders):
            held = [hi - lo for ranges in stripes for lo, hi in (ranges[i],)]
            # its stripes, the largest once more (a write's new file beside the old one)
            check_nvme_folder(folder, sum(held) + max(held, default=0) + extra_bytes
                              + checkpoint_copies * sum(held))
        largest = max(self.file_bytes.values(), default=ALIGN)
        self.staging = [aligned_buffer(largest) for _ in range(staging_buffers)]
        # page-locked (pin: the device's) for the loads' copies to the GPU
        largest = padded(2 * max(self.weights_numel.values(), default=0))
        self.weight_staging = [aligned_buffer(largest) for _ in range(weight_staging_buffers)]
        for buffer in self.weight_staging if pin is not None else ():
            pin(buffer)
        self.slot_of_block: dict[int, int] = {}  # block -> staging slot while it is read in
        direct = [supports_direct(folder) for folder in self.folders]
        # the drives' stripes of a read or write at once (a thread each: the calls drop the GIL)
        # and a pool each way: the read and write lanes run at once, as the drives can
        self._pools = (tuple(ThreadPoolExecutor(n) for _ in range(2)) if n > 1 else None)
        self.files = {b: StripedFile(self.folders, f"state_{b}.bin", self.file_bytes[b], direct,
                                     self._pools) for b in self.disk_blocks}
        for b in self.disk_blocks:  # fresh state: sparse files of zeros
            self.files[b].create()
        for folder in self.folders:  # a stopped run's pins (the folder is this run's now)
            for stale in folder.glob(f"*{PIN_SUFFIX}"):
                stale.unlink(missing_ok=True)

    def required_bytes(self) -> int:
        """Disk bytes the files take, plus the largest once more: a write's new file exists
        beside the old one until it replaces it, and the plan's one nvme_write lane writes one
        file at a time."""
        return sum(self.file_bytes.values()) + max(self.file_bytes.values(), default=0)

    def paths(self, block: int) -> list[Path]:
        """The block's file: its stripes, one per folder (one plain file with one folder)."""
        return self.files[block].paths

    def pin_files(self) -> dict[str, Path]:
        """Hard links of every state file as it is now, by its name: a checkpoint written
        beside training links these, as the tier replaces the files meanwhile."""
        pins = {}
        for b in self.disk_blocks:
            for path in self.paths(b):
                pin = path.with_name(path.name + PIN_SUFFIX)
                pin.unlink(missing_ok=True)
                os.link(path, pin)
                pins[path.name] = pin
        return pins

    def remove_files(self) -> None:
        """Delete the state files once the run is over: scratch by then, and often tens of GB.
        Checkpoints hold hard links of their own, which this leaves whole."""
        for b in self.disk_blocks:
            self.files[b].remove()
        for pool in self._pools or ():
            pool.shutdown()

    def views(self, block: int, slot: int) -> tuple[torch.Tensor, Moments]:
        """The block's on-disk master and moments parts: views of a staging buffer (empty
        where the block keeps that state wholly in RAM)."""
        km, kv = self.master_numel.get(block, 0), self.moments_numel.get(block, 0)
        buffer = self.staging[slot]
        master = buffer[:4 * km].view(torch.float32)
        moments_bytes = Moments.nbytes_of(self.moment_precision, kv)
        return master, Moments.in_buffer(self.moment_precision, kv,
                                         buffer[4 * km:4 * km + moments_bytes])

    def weights_view(self, block: int, slot: int) -> torch.Tensor:
        """The block's on-disk bf16 weights part in a (state) staging buffer: where its update
        writes them, for the write that follows."""
        start = self.state_bytes.get(block, 0)
        size = 2 * self.weights_numel.get(block, 0)
        return self.staging[slot][start:start + size].view(torch.bfloat16)

    def staged_weights(self, block: int, slot: int) -> torch.Tensor:
        """The block's on-disk bf16 weights as a weight staging buffer holds them after
        read_weights (what its load copies to the GPU)."""
        return self.weight_staging[slot][:2 * self.weights_numel[block]].view(torch.bfloat16)

    def read(self, block: int, slot: int) -> None:
        """Read the block's state part (master and moments) into a staging buffer."""
        if self.state_bytes.get(block, 0):  # else its share rounds to nothing: nothing to read
            self.files[block].read(self.staging[slot], 0, self.state_bytes[block])
        self.slot_of_block[block] = slot

    def read_weights(self, block: int, slot: int) -> None:
        """Read the block's bf16 weights part into a weight staging buffer."""
        start = self.state_bytes[block]
        self.files[block].read(self.weight_staging[slot], start, self.file_bytes[block] - start)

    def write(self, block: int, slot: int) -> None:
        """Write the staging buffer to new files that then replace the block's."""
        if block not in self.files:
            return
        try:
            self.files[block].write(self.staging[slot])
        except OSError as err:
            raise NvmeSpaceError(err.errno, f"writing the NVMe state of block {block} failed "
                                 f"({err.strerror}); {self.paths(block)[0].name} and the "
                                 "other files still hold the previous state") from err
        self.slot_of_block.pop(block, None)

    def restore_files(self, block: int, sources: list[Path]) -> None:
        """Make a checkpoint's copies of the block's file (its stripes, in order) the current
        one: linked where they are striped as this run's, else read and written anew (a resume
        on another count of drives)."""
        if len(sources) == len(self.paths(block)):
            self.files[block].restore(sources)
            return
        held = sum(source.stat().st_size for source in sources)
        if held != self.file_bytes[block]:
            raise ValueError(f"{sources[0]} and its other stripes hold {held} bytes, this run's "
                             f"state_{block}.bin {self.file_bytes[block]}: resume with the "
                             "policy that wrote the checkpoint")
        staging = self.staging[0]
        staging[:held].copy_(torch.frombuffer(bytearray(read_stripes(sources, 0, held)),
                                              dtype=torch.uint8))
        self.write(block, 0)

    def read_block(self, block: int) -> tuple[torch.Tensor, Moments]:
        """Copies of a block's on-disk master and moments parts (outside a segment: through
        staging buffer 0)."""
        self.read(block, 0)
        self.slot_of_block.pop(block, None)
        master, moments = self.views(block, 0)
        return master.clone(), Moments(moments.precision, {
            name: t.clone() for name, t in moments.tensors.items()})

    def update_block(self, block: int, master: torch.Tensor | None = None,
                     weights: torch.Tensor | None = None,
                     moments: Moments | None = None) -> None:
        """Replace a block's on-disk master part, moments part and/or bf16 weights part
        (outside a segment), keeping the rest."""
        self.files[block].read(self.staging[0], 0, self.file_bytes[block])
        if master is not None:
            self.views(block, 0)[0].copy_(master)
        if moments is not None:
            self.views(block, 0)[1].copy_(moments)
        if weights is not None:
            self.weights_view(block, 0).copy_(weights)
        self.write(block, 0)


LOCK_NAME = ".layerslide-nvme.lock"


def state_file_stripes(files: dict[str, Path], block: int) -> list[Path]:
    """A block's state file among files by name (a checkpoint's links): its stripes in order,
    as StripedFile names them (state_B.bin alone, or state_B.s0.bin, state_B.s1.bin, ...)."""
    if f"state_{block}.bin" in files:
        return [files[f"state_{block}.bin"]]
    stripes, i = [], 0
    while f"state_{block}.s{i}.bin" in files:
        stripes.append(files[f"state_{block}.s{i}.bin"])
        i += 1
    return stripes


def read_stripes(stripes: list[Path], start: int, nbytes: int) -> bytes:
    """Bytes [start, start + nbytes) of a file striped as `stripes` (its stripes in order, as
    state_file_stripes lists them)."""
    data, offset = bytearray(), 0
    for stripe in stripes:
        size = stripe.stat().st_size
        if offset + size > start and len(data) < nbytes:
            with open(stripe, "rb") as f:
                f.seek(max(0, start - offset))
                data += f.read(nbytes - len(data))
        offset += size
    if len(data) < nbytes:
        raise ValueError(f"{', '.join(map(str, stripes)) or 'no state file'}: holds "
                         f"{offset} bytes, fewer than the {start + nbytes} its checkpoint needs")
    return bytes(data)


def disk_parts(precision: MomentPrecision, master_numel: int,
               moments_numel: int) -> dict[str, tuple[int, int, torch.dtype]]:
    """(start byte, elements, dtype) of each tensor's part in a block's state file, as
    NvmeState lays it out: the master part, then the moments part as Moments.layout orders
    it."""
    parts, start = {"master": (0, master_numel, torch.float32)}, 4 * master_numel
    for name, size, dtype in Moments.layout(precision, moments_numel):
        parts[name] = (start, size, dtype)
        start += size * dtype.itemsize
    return parts


class NvmeFolderLocks:
    """An exclusive lock on each NVMe folder for one run's life: two runs there would share
    the state_*.bin and activation file names, each reading the other's writes, and the first
    to end would delete the other's files (one process's runs are its own affair). Released by
    release(), or when the process ends."""

    def __init__(self, folders: Sequence[Path]):
        import fcntl

        self._files = []
        try:
            for folder in folders:
                check_nvme_folder(folder, 0)  # writable, or refused in the folder's words
                lock = open(folder / LOCK_NAME, "a+")  # noqa: SIM115 (held for the run)
                self._files.append(lock)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    lock.seek(0)
                    holder = lock.read().strip() or "another process"
                    if holder == f"pid {os.getpid()}":  # a run of this process, not closed
                        continue  # (a notebook's, a test's): the lock keeps out the others
                    raise ValueError(f"the NVMe folder {folder} is in use by another run "
                                     f"({holder}): give this run a folder of its own "
                                     "(--nvme-dir)") from None
                lock.seek(0)
                lock.truncate()
                lock.write(f"pid {os.getpid()}")
                lock.flush()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for lock in self._files:
            lock.close()  # closing drops the flock
        self._files = []


def check_nvme_folder(folder: Path, needed_bytes: int) -> None:
    """Refuse a folder that cannot be written or lacks room, before anything is allocated."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".layerslide-write-test"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as err:
        raise NvmeSpaceError(err.errno, f"the NVMe folder {folder} cannot be written "
                             f"({err.strerror}): pass --nvme-dir a writable folder") from err
    free = shutil.disk_usage(folder).free
    if needed_bytes > free:
        raise NvmeSpaceError(errno.ENOSPC, f"the NVMe tier needs {needed_bytes / 1e9:.2f} GB in "
                             f"{folder}, which has {free / 1e9:.2f} GB free: free space, pass "
                             "another --nvme-dir, or keep less on NVMe (--moments-on-nvme)")


def supports_direct(folder: Path) -> bool:
    """Whether the filesystem takes O_DIRECT (tmpfs, for one, does not)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = folder / ".layerslide-direct-test"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    try:
        os.pwritev(fd, [memoryview(aligned_buffer(ALIGN).numpy())], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


ACTIVATION_IO_ENV = "LAYERSLIDE_ACTIVATION_IO"  # 'buffered': checkpoints through the page cache


class ActivationFiles:
    """Activation checkpoints on disk, a file per layer and copy (`activations_<layer>.bin`, or
    `activations_<layer>_<copy>.bin` where a layer has several checkpoints waiting at once: one
    per micro-batch of a layer-major sweep), taken in turn from the tier's folders (one per
    drive). A checkpoint is written after its forward and read back before its backward, and
    the plan orders the next write of that file after the read.

    O_DIRECT where the filesystem takes it, whole 4 KiB blocks from page-aligned buffers
    (`host_buffer`), at the rates calibrate measures and the simulator prices: rewritten through
    the page cache into a truncated file they ran slower than those on the H200, and over the
    old bytes they stay in RAM (benchmarks/results/archive/activation_io_2026-12-04)."""

    def __init__(self, folders: str | Path | Sequence[str | Path], num_layers: int,
                 copies: int = 1):
        self.folders = nvme_folders(folders)
        self.num_layers, self.copies = num_layers, copies
        io = os.environ.get(ACTIVATION_IO_ENV, "direct")
        if io not in ("direct", "buffered"):
            raise ValueError(f"{ACTIVATION_IO_ENV}={io!r}: set it to 'direct' (O_DIRECT where "
                             "the filesystem takes it, the default) or 'buffered' (through the "
                             "page cache)")
        self.direct = {folder: io == "direct" and supports_direct(folder)
                       for folder in self.folders}

    @staticmethod
    def files_per_folder(num_layers: int, copies: int, folders: int) -> int:
        """The most checkpoint files one folder holds (dealt out in turn)."""
        return -(-num_layers * copies // folders)

    @staticmethod
    def host_buffer(numel: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """A checkpoint's host tensor whose storage is page-aligned and runs on to a whole 4 KiB
        block, as O_DIRECT reads and writes it (page-locked where a GPU copies it)."""
        nbytes = padded(numel * torch.empty((), dtype=dtype).element_size())
        if pinned:  # cudaHostAlloc's pages (torch's pinned caching allocator)
            raw = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        else:  # the heap's are not page-aligned
            raw = aligned_buffer(nbytes)
        return raw.view(dtype)[:numel]

    def path(self, layer: int, copy: int = 0) -> Path:
        suffix = f"_{copy}" if self.copies > 1 else ""
        folder = self.folders[(layer * self.copies + copy) % len(self.folders)]
        return folder / f"activations_{layer}{suffix}.bin"

    def remove_files(self) -> None:
        """Delete this run's checkpoint files (scratch once it is over), and no other file of a
        folder that may be shared."""
        for layer in range(self.num_layers):
            for copy in range(self.copies):
                self.path(layer, copy).unlink(missing_ok=True)

    def _bytes_of(self, path: Path, host: torch.Tensor) -> tuple[memoryview, int]:
        """The host tensor's bytes as the file holds them, and the open flag for them: whole
        blocks under O_DIRECT where the folder takes it and the buffer allows (host_buffer's),
        else the tensor's own bytes through the page cache."""
        nbytes = host.numel() * host.element_size()
        storage, start = host.untyped_storage(), host.storage_offset() * host.element_size()
        if (self.direct[path.parent] and host.data_ptr() % ALIGN == 0
                and start + padded(nbytes) <= storage.nbytes()):
            raw = torch.empty(0, dtype=torch.uint8).set_(storage, start, (padded(nbytes),))
            return memoryview(raw.numpy()), os.O_DIRECT
        return memoryview(host.view(-1).view(torch.uint8).numpy()), 0

    def _refused_direct(self, path: Path, err: OSError) -> bool:
        """Whether an O_DIRECT call failed for its memory or alignment (pinned memory some
        drivers map so that the disk's DMA cannot reach it, EFAULT; EINVAL): the folder's
        checkpoints go through the page cache from then on, said once."""
        if err.errno not in (errno.EFAULT, errno.EINVAL) or not self.direct[path.parent]:
            return False
        self.direct[path.parent] = False
        warnings.warn(f"O_DIRECT on {path.parent} failed ({err.strerror}): activation "
                      "checkpoints there go through the page cache", stacklevel=3)
        return True

    def write(self, layer: int, host: torch.Tensor, copy: int = 0) -> None:
        path = self.path(layer, copy)
        view, direct = self._bytes_of(path, host)
        try:
            self._write(path, view, direct)
        except OSError as err:
            if not (direct and self._refused_direct(path, err)):
                raise NvmeSpaceError(err.errno, f"writing the activation checkpoint "
                                     f"{path} failed ({err.strerror})") from err
            self.write(layer, host, copy)

    @staticmethod
    def _write(path: Path, view: memoryview, direct: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
        try:
            write_fully(fd, view)
        finally:
            os.close(fd)

    def read(self, layer: int, host: torch.Tensor, copy: int = 0) -> None:
        path = self.path(layer, copy)
        view, direct = self._bytes_of(path, host)
        nbytes = host.numel() * host.element_size()
        if direct and path.stat().st_size % ALIGN:  # written through the page cache: so read
            view, direct = memoryview(host.view(-1).view(torch.uint8).numpy()), 0
        try:
            done = self._read(path, view, direct)
        except OSError as err:
            if not (direct and self._refused_direct(path, err)):
                raise
            self.read(layer, host, copy)
            return
        if done < nbytes:
            raise OSError(errno.EIO, f"{path} ended after {done} of {nbytes} bytes")

    @staticmethod
    def _read(path: Path, view: memoryview, direct: int) -> int:
        fd = os.open(path, os.O_RDONLY | direct)
        try:
            return read_fully(fd, view)
        finally:
            os.close(fd)
