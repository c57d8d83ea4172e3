"""Checkpoints written while training goes on.

A checkpoint is the state of every block after one step. Its groups (one per block) are written
by CheckpointStore.save on a thread of its own, in the order the blocks' next updates come,
while the next steps run. An update of a block whose group is not written yet first waits for
it or, within a RAM budget, copies the group (copy on write) and lets the writer take the copy:
the checkpoint holds exactly the state after its step, the same bytes as a synchronous one. A
copier runs ahead of the updates from the start, copying the groups in that order on several
threads while the GPU computes; the time updates spend waiting or copying is the training's
stall (CheckpointSnapshot.stall_s).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from layerslide.executor.checkpoint_store import (
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
    pending, being copied, being written or done; see the module docstring."""

    def __init__(self, groups: Groups, group_of_block: Mapping[int, str], copy_budget_bytes: int):
        self._groups, self._group_of_block = groups, dict(group_of_block)
        self._state = dict.fromkeys(groups, _PENDING)
        self._copies: dict[str, dict[str, torch.Tensor]] = {}
        self._budget_left = max(0, copy_budget_bytes)
        self._guarded = set(self._group_of_block.values())
        self._cond = threading.Condition()
        self._closed = False
        self.stall_s = 0.0  # time updates waited or copied
        self.copied_bytes = 0

    # --- the copier's side -------------------------------------------------------------------
    def start_copying(self, threads: int | None = None) -> threading.Thread:
        """Copy the guarded groups in their order, within the budget, on `threads` threads
        (default: half the cores, at most 8), ahead of the updates that would wait for them."""
        threads = threads or max(1, min(8, (os.cpu_count() or 2) // 2))
        copier = threading.Thread(target=self._copy_ahead, args=(threads,), daemon=True,
                                  name="checkpoint-copier")
        copier.start()
        return copier

    def _copy_ahead(self, threads: int) -> None:
        with ThreadPoolExecutor(threads) as pool:
            for group in self._groups:
                with self._cond:
                    if self._closed:
                        return
                    nbytes = sum(t.nbytes for t in self._groups[group].values())
                    if (group not in self._guarded or self._state[group] != _PENDING
                            or group in self._copies):
                        continue
                    if nbytes > self._budget_left:
                        continue  # the writer takes it from the live tensors; a smaller may fit
                    self._state[group] = _COPYING
                    self._budget_left -= nbytes
                try:
                    copies = {name: _parallel_clone(t, pool)
                              for name, t in self._groups[group].items()}
                except (MemoryError, RuntimeError):  # a copy is an optimisation: go on without
                    self._abandon(group, nbytes)
                    return
                self._copied(group, copies, nbytes)

    # --- the writer's side -------------------------------------------------------------------
    def claim(self, group: str, tensors: Mapping[str, torch.Tensor]
              ) -> Mapping[str, torch.Tensor]:
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
                self._budget_left += sum(t.nbytes for t in copy.values())
            self._cond.notify_all()

    def release_all(self) -> None:
        """The save ended (whole or failed): no update waits for it any more."""
        with self._cond:
            self._closed = True
            for group in self._state:
                self._state[group] = _DONE
            self._copies.clear()
            self._cond.notify_all()

    def _abandon(self, group: str, nbytes: int) -> None:
        """A copy that failed: the group is the writer's to take from the live tensors again."""
        with self._cond:
            if self._state[group] == _COPYING:
                self._state[group] = _PENDING
            self._budget_left += nbytes
            self._cond.notify_all()

    def _copied(self, group: str, copies: dict[str, torch.Tensor], nbytes: int) -> None:
        with self._cond:
            if self._state[group] != _COPYING:  # the save ended meanwhile
                return
            self._copies[group] = copies
            self._state[group] = _PENDING
            self.copied_bytes += nbytes
            self._cond.notify_all()

    # --- the updates' side -------------------------------------------------------------------
    def before_update(self, block: int) -> None:
        """Call before changing `block`'s state: returns once the checkpoint no longer needs
        the live tensors (written, or copied)."""
        group = self._group_of_block.get(block)
        if group is None:
            return
        start_s = time.perf_counter()
        with self._cond:
            state = self._state[group]
            if state == _DONE or group in self._copies:
                return
            nbytes = sum(t.nbytes for t in self._groups[group].values())
            copy = state == _PENDING and nbytes <= self._budget_left
            if copy:
                self._state[group] = _COPYING
                self._budget_left -= nbytes
        if copy:  # outside the lock: the writer goes on with the other groups meanwhile
            try:
                copies = {name: t.clone() for name, t in self._groups[group].items()}
            except BaseException:
                self._abandon(group, nbytes)
                raise  # the update fails, and training with it, with this error
            self._copied(group, copies, nbytes)
        else:
            with self._cond:
                while self._state[group] != _DONE and group not in self._copies:
                    self._cond.wait()
        with self._cond:
            self.stall_s += time.perf_counter() - start_s


def _parallel_clone(tensor: torch.Tensor, pool: ThreadPoolExecutor) -> torch.Tensor:
    """A contiguous copy of a CPU tensor, its chunks copied on the pool's threads (torch's
    copy releases the GIL)."""
    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    src, dst = tensor.reshape(-1), out.view(-1)  # view: dst must be out's own memory
    list(pool.map(lambda start: dst[start:start + COPY_CHUNK].copy_(
        src[start:start + COPY_CHUNK]), range(0, src.numel(), COPY_CHUNK)))
    return out


class CheckpointSnapshot:
    """One checkpoint being written on a thread of its own (see the module docstring)."""

    def __init__(self, store: CheckpointStore, step: int, groups: Groups, meta: dict, *,
                 link_files: Mapping[str, Path], guard: SnapshotGuard, stall_s: float = 0.0):
        self.guard, self.step = guard, step
        self._prepare_stall_s = stall_s  # spent before the writer started (a drained pipeline)
        self.waited_s = 0.0  # for the checkpoint before it to be written (set by the trainer)
        self._info: CheckpointInfo | None = None
        self._error: BaseException | None = None
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

    def done(self) -> bool:
        return not self._thread.is_alive()

    @property
    def stall_s(self) -> float:
        return self._prepare_stall_s + self.guard.stall_s

    def wait(self) -> CheckpointInfo:
        """The written checkpoint, once whole; raises what the write raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._info is not None
        return self._info
