"""Memory of a simulated run: bytes in use per tier as the plan's buffers come and go, and on the
GPU per allocation pool with what the caching allocator reserves for them.

A buffer comes as the task allocating it starts and goes as the last task releasing it ends. The
executor allocates a buffer on the stream of the lane whose task allocates it (a layer's fetched
checkpoint on h2d, its grads on gpu), the static ones before the plan runs. torch's caching
allocator keeps one pool per stream and never hands a block freed on one stream to another, so
the pools' peaks add up even where they fall at different times (3B micro-batch 32, H200: h2d
held 0.57 GiB of fetched checkpoints; benchmarks/results/validation_2026-11-30c), and each pool
keeps the holes its own order of requests leaves (simulator.allocator).

Allocating as the task's dispatch begins, as the executor's threads do, was tried too: with the
plan's buffers as lumps (a task's scratch tensors as one workspace) it put 2.5-4.8% mean error on
the allocated peak against 1.8-1.9% this way, for 4-5% on the reserve either way
(validation_2026-11-30d and e, predicted again).
"""

from __future__ import annotations

from layerslide.planner.plan import Plan, runtime_buffer_id
from layerslide.simulator.allocator import CachingAllocatorModel
from layerslide.trace import TIERS, MemorySample

STATIC_POOL = "static"  # buffers allocated before the plan runs


class MemoryLedger:
    """Bytes in use per tier, GPU bytes per pool and the allocator's reserve, over a run."""

    def __init__(self, plan: Plan):
        self.in_use = dict.fromkeys(TIERS, 0)
        self.samples: list[MemorySample] = []
        self.pool_in_use: dict[str, int] = {}
        self.pool_peaks: dict[str, int] = {}
        self.allocator = CachingAllocatorModel()
        self._allocs: dict[str, list] = {}
        self._releases: dict[str, list] = {}
        self._pending: dict[str, int] = {}
        self._pool: dict[str, str] = {}
        runtime = runtime_buffer_id("gpu")
        for b in plan.buffers:
            self._pool[b.id] = (STATIC_POOL if b.alloc_task is None
                                else plan.task(b.alloc_task).lane)
            if b.alloc_task is None:
                self._change(0.0, b, 1, sample=False, allocator=b.id != runtime)
            else:
                self._allocs.setdefault(b.alloc_task, []).append(b)
            if b.release_tasks:
                self._pending[b.id] = len(b.release_tasks)
            for t in b.release_tasks:
                self._releases.setdefault(t, []).append(b)
        for tier in TIERS:
            self.samples.append(MemorySample(time_s=0.0, tier=tier, bytes_in_use=self.in_use[tier]))

    def _change(self, now: float, buffer, sign: int, *, sample: bool = True,
                allocator: bool = True) -> None:
        tier = buffer.tier
        self.in_use[tier] += sign * buffer.bytes
        assert self.in_use[tier] >= 0, f"{tier} memory went negative"
        if sample:
            self.samples.append(MemorySample(time_s=now, tier=tier,
                                             bytes_in_use=self.in_use[tier]))
        if tier != "gpu":
            return
        pool = self._pool[buffer.id]
        self.pool_in_use[pool] = self.pool_in_use.get(pool, 0) + sign * buffer.bytes
        self.pool_peaks[pool] = max(self.pool_peaks.get(pool, 0), self.pool_in_use[pool])
        if not allocator:  # the runtime's bytes: no allocation
            return
        if sign > 0:
            self.allocator.allocate(pool, buffer.id, buffer.bytes)
        else:
            self.allocator.free(buffer.id)

    def allocate(self, now: float, task_id: str) -> None:
        """The task has started: its buffers come."""
        for b in self._allocs.get(task_id, ()):
            self._change(now, b, 1)

    def release(self, now: float, task_id: str) -> None:
        """The task has ended: the buffers it was the last to release go."""
        for b in self._releases.get(task_id, ()):
            self._pending[b.id] -= 1
            if self._pending[b.id] == 0:
                self._change(now, b, -1)

    def gpu_pool_reserves(self) -> dict[str, int]:
        """What the caching allocator has reserved per pool so far (it never gives pages back
        while training)."""
        return self.allocator.reserved_bytes()
