"""Checkpoints written while training goes on.

A checkpoint is the state of every block after one step. Its groups (one per block) are written
by CheckpointStore.save on a thread of its own, in the order the blocks' next updates come,
while the next steps run. Within a RAM budget every group is copied first (copy on write) and
written from its copy: by a copier that runs ahead of the updates from the start, by the writer
before it writes a group, or by the group's next update, whichever comes first. Beyond the
budget the writer takes the live tensors and the update waits for the write. Either way the
checkpoint holds exactly the state after its step, the same bytes as a synchronous one; the
time updates spend waiting or copying is the training's stall (CheckpointSnapshot.stall_s).

Copy buffers are kept from one checkpoint to the next (keep_copy_buffers makes them ahead of
the first): a copy into fresh memory faults its pages in, well below memory speed
(benchmarks/results/archive/checkpoint_stall_2026-12-03).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from layerslide.executor import waits
from layerslide.executor.nvme import aligned_buffer
from layerslide.training.checkpoint_store import (
    CheckpointInfo,
    CheckpointStore,
    GroupAccess,
    Groups,
)

RAM_RESERVE_BYTES = 8 << 30  # left to the OS and the CUDA driver (as host.reserve in profiles)
COPY_CHUNK = 16 << 20  # elements a copy thread takes at a time
_PENDING, _COPYING, _WRITING, _DONE = "pending", "copying", "writing", "done"


def available_ram_bytes() -> int:
    """MemAvailable of /proc/meminfo (0 where it cannot be read: then updates only wait)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class SnapshotGuard(GroupAccess):
    """Between the writer and the updates of the blocks in `group_of_block`: a group is
    pending, being copied, being written or done; see the module docstring. `kept` holds
    copy buffers by group, kept from an earlier checkpoint (reused: their memory is already
    faulted in) and given this checkpoint's copies to keep; fresh ones come out of the budget."""

    def __init__(self, groups: Groups, group_of_block: Mapping[int, str], copy_budget_bytes: int,
                 *, kept: dict[str, dict[str, torch.Tensor]] | None = None,
                 threads: int | None = None):
        self._groups, self._group_of_block = groups, dict(group_of_block)
        self._state = dict.fromkeys(groups, _PENDING)
        self._copies: dict[str, dict[str, torch.Tensor]] = {}
        self._fresh: set[str] = set()  # groups whose copy came out of the budget
        self._kept = {} if kept is None else kept
        self._budget_left = max(0, copy_budget_bytes)
        self._guarded = set(self._group_of_block.values())
        self._threads = threads or default_copy_threads()
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="checkpoint-copy")
        self._cond = threading.Condition()
        self._closed = False
        self.stall_s = 0.0  # time updates waited or copied
        self.copied_bytes = 0

    # --- copies ------------------------------------------------------------------------------
    def _begin_copy(self, group: str) -> dict[str, torch.Tensor] | None:
        """Under the lock: buffers to copy a pending guarded group into (kept ones, or fresh
        within the budget), the group then being copied; None where it is not to be copied."""
        if (self._closed or group not in self._guarded or self._state[group] != _PENDING
                or group in self._copies):
            return None
        live = self._groups[group]
        buffers = self._kept.get(group)
        if buffers is None or not _fits(buffers, live):
            nbytes = sum(t.nbytes for t in live.values())
            if nbytes > self._budget_left:
                return None  # the writer takes it from the live tensors; a smaller may fit
            try:
                buffers = {name: page_aligned_like(t) for name, t in live.items()}
            except (MemoryError, RuntimeError, OSError):  # OSError: mmap's
                return None
            self._budget_left -= nbytes
            self._fresh.add(group)
        self._state[group] = _COPYING
        return buffers

    def _copy(self, group: str, buffers: dict[str, torch.Tensor], *,
              own_thread: bool = False) -> None:
        """Outside the lock: fill the buffers from the live tensors, on the copy threads (or,
        for an update that waits on it, on its own: not queued behind other groups' chunks)."""
        try:
            for name, tensor in self._groups[group].items():
                if own_thread:
                    _copy_whole(tensor, buffers[name])
                else:
                    _parallel_copy(tensor, buffers[name], self._pool)
        except Exception:
            self._abandon(group)
            if self._closed:  # the save ended (its pool with it): nothing needs this copy
                return
            raise
        except BaseException:
            self._abandon(group)
            raise
        with self._cond:
            if self._state[group] == _COPYING:  # else the save ended meanwhile
                self._copies[group] = buffers
                self._state[group] = _PENDING
                self.copied_bytes += sum(t.nbytes for t in buffers.values())
            self._cond.notify_all()

    def _abandon(self, group: str) -> None:
        """A copy that failed: the group is the writer's to take from the live tensors again."""
        with self._cond:
            if self._state[group] == _COPYING:
                self._state[group] = _PENDING
            if group in self._fresh:
                self._fresh.discard(group)
                self._budget_left += sum(t.nbytes for t in self._groups[group].values())
            self._cond.notify_all()

    # --- the copier's side -------------------------------------------------------------------
    def start_copying(self) -> threading.Thread:
        """Copy the guarded groups in their order, ahead of the updates that would wait."""
        copier = threading.Thread(target=self._copy_ahead, daemon=True, name="checkpoint-copier")
        copier.start()
        return copier

    def _copy_ahead(self) -> None:
        for group in self._groups:
            with self._cond:
                buffers = self._begin_copy(group)
            if buffers is None:
                continue
            try:
                self._copy(group, buffers)
            except (MemoryError, RuntimeError):  # a copy is an optimisation: go on without
                return

    # --- the writer's side -------------------------------------------------------------------
    def claim(self, group: str, tensors: Mapping[str, torch.Tensor]
              ) -> Mapping[str, torch.Tensor]:
        """The tensors to write: a copy, made first where it can be (a write from the live
        tensors holds up the group's update for as long as the disk takes)."""
        with self._cond:
            while self._state[group] == _COPYING:
                self._cond.wait()
            buffers = self._begin_copy(group)
        if buffers is not None:
            try:
                self._copy(group, buffers)
            except (MemoryError, RuntimeError):
                pass  # written from the live tensors instead
        with self._cond:
            while self._state[group] == _COPYING:
                self._cond.wait()
            self._state[group] = _WRITING
            return self._copies.get(group, tensors)

    def release(self, group: str) -> None:
        with self._cond:
            self._state[group] = _DONE
            copy = self._copies.pop(group, None)
            if copy is not None:
                self._kept[group] = copy  # for the next checkpoint
            self._cond.notify_all()

    def release_all(self) -> None:
        """The save ended (whole or failed): no update waits for it any more."""
        with self._cond:
            self._closed = True
            for group in self._state:
                self._state[group] = _DONE
            for group, copy in self._copies.items():
                self._kept[group] = copy
            self._copies.clear()
            self._cond.notify_all()
        # chunks already queued still run: wait for them, or a failed save's last copies could
        # go on writing a kept buffer the next checkpoint copies into
        self._pool.shutdown(wait=True)

    # --- the updates' side -------------------------------------------------------------------
    def before_update(self, block: int) -> None:
        """Call before changing `block`'s state: returns once the checkpoint no longer needs
        the live tensors (written, or copied)."""
        group = self._group_of_block.get(block)
        if group is None:
            return
        start_s = time.perf_counter()
        with self._cond:
            if self._state[group] == _DONE or group in self._copies:
                return
            buffers = self._begin_copy(group)
        if buffers is not None:  # the update fails, and training with it, if its copy fails
            self._copy(group, buffers, own_thread=True)
        with self._cond:
            while self._state[group] != _DONE and group not in self._copies:
                self._cond.wait()
            self.stall_s += time.perf_counter() - start_s


def default_copy_threads() -> int:
    """Threads that copy a checkpoint's groups: half the cores, at most 8 (the rest go on with
    the optimizer)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def page_aligned_like(tensor: torch.Tensor) -> torch.Tensor:
    """An empty contiguous tensor of tensor's shape and dtype in page-aligned memory (an
    anonymous mmap): the checkpoint's writer sends such tensors to the disk with O_DIRECT."""
    nbytes = tensor.numel() * tensor.element_size()
    return aligned_buffer(nbytes)[:nbytes].view(tensor.dtype).reshape(tensor.shape)


def _fits(buffers: Mapping[str, torch.Tensor], live: Mapping[str, torch.Tensor]) -> bool:
    return buffers.keys() == live.keys() and all(
        buffers[n].shape == t.shape and buffers[n].dtype == t.dtype for n, t in live.items())


def _copy_whole(src: torch.Tensor, dst: torch.Tensor) -> None:
    """src into the contiguous CPU tensor dst on the calling thread (torch's own threads)."""
    dst.view(-1).copy_(src.reshape(-1))


def _parallel_copy(src: torch.Tensor, dst: torch.Tensor, pool: ThreadPoolExecutor) -> None:
    """src into the contiguous CPU tensor dst, in chunks on the pool's threads (torch's copy
    releases the GIL)."""
    flat_src, flat_dst = src.reshape(-1), dst.view(-1)  # view: dst must be its own memory
    _in_chunks(pool, flat_dst.numel(), lambda part: flat_dst[part].copy_(flat_src[part]))


def _in_chunks(pool: ThreadPoolExecutor, numel: int, work) -> None:
    """work(slice) over [0, numel) in COPY_CHUNK pieces on the pool's threads."""
    list(pool.map(lambda start: work(slice(start, start + COPY_CHUNK)),
                  range(0, numel, COPY_CHUNK)))


def keep_copy_buffers(groups: Groups, budget_bytes: int,
                      kept: dict[str, dict[str, torch.Tensor]], *,
                      threads: int | None = None) -> int:
    """Allocate copy buffers for the groups, in their order, within the budget, and
    touch every page (zeroing them on the copy threads): a checkpoint then copies at memory
    speed instead of faulting fresh pages in. Returns the bytes kept (in `kept`, all told)."""
    with ThreadPoolExecutor(threads or default_copy_threads()) as pool:
        for group, live in groups.items():
            if group in kept and _fits(kept[group], live):
                continue
            nbytes = sum(t.nbytes for t in live.values())
            if nbytes > budget_bytes:
                continue
            try:
                buffers = {name: page_aligned_like(t) for name, t in live.items()}
            except (MemoryError, OSError):  # an optimisation: the checkpoints copy afresh
                break
            for buffer in buffers.values():
                flat = buffer.view(-1)
                _in_chunks(pool, flat.numel(), lambda part, flat=flat: flat[part].zero_())
            kept[group] = buffers
            budget_bytes -= nbytes
    return sum(t.nbytes for buffers in kept.values() for t in buffers.values())


class CheckpointSnapshot:
    """One checkpoint being written on a thread of its own (see the module docstring)."""

    def __init__(self, store: CheckpointStore, step: int, groups: Groups, meta: dict, *,
                 link_files: Mapping[str, Path], guard: SnapshotGuard, stall_s: float = 0.0):
        self.guard, self.step = guard, step
        self._prepare_stall_s = stall_s  # spent before the writer started (a drained pipeline)
        self.waited_s = 0.0  # for the checkpoint before it to be written (set by the trainer)
        self._info: CheckpointInfo | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()  # not the thread's is_alive(): see executor.waits
        self._thread = threading.Thread(
            target=self._write, args=(store, step, groups, meta, link_files), daemon=True,
            name=f"checkpoint-step-{step}")
        self.started_s = time.monotonic()
        self.write_s: float | None = None
        self._thread.start()
        guard.start_copying()

    def _write(self, store, step, groups, meta, link_files) -> None:
        try:
            self._info = store.save(step, groups, meta, link_files=link_files, access=self.guard)
        except BaseException as err:  # noqa: BLE001 (raised to the trainer by wait())
            self._error = err
        finally:
            self.guard.release_all()
            self.write_s = time.monotonic() - self.started_s
            self._finished.set()

    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def stall_s(self) -> float:
        return self._prepare_stall_s + self.guard.stall_s

    def wait(self) -> CheckpointInfo:
        """The written checkpoint, once whole; raises what the write raised."""
        waits.until(self._finished)
        if self._error is not None:
            raise self._error
        assert self._info is not None
        return self._info
