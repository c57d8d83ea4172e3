"""Memory of a simulated run: bytes in use per tier as the plan's buffers come and go, and on the
GPU per allocation pool with what the caching allocator reserves for them.

Bytes in use follow the tasks on their lanes: a buffer comes as the task allocating it starts
(a task's outputs, Buffer.at_end, as it ends: its scratch is gone by then, its inputs not yet)
and goes as the last task releasing it ends. The executor allocates a buffer on the stream of
the lane whose task allocates it (a layer's fetched checkpoint on h2d, its grads on gpu), the static ones before the
plan runs. torch's caching allocator keeps one pool per stream and never hands a block freed on
one stream to another, so the pools' peaks add up even where they fall at different times (3B
micro-batch 32, H200: h2d held 0.57 GiB of fetched checkpoints;
benchmarks/results/archive/validation_2026-11-30c), and each pool keeps the holes its own order of
requests leaves (simulator.allocator).

The allocator's model follows the host threads instead, as the caching allocator sees the
requests: a task's blocks are requested as its dispatch begins (its outputs as the dispatch
ends), a block only its own stream used is free again once the thread has enqueued its last
user (stream order makes it safe), and one another stream used once that user's GPU work has
ended (its event must complete first). On the 14 rows of validation_2026-11-30i/j this, the
outputs made at the end, the head's requests in their order and cuBLAS's workspaces took the
allocated peak's mean error from 2.2% to 0.7% and the reserve's from 5.8% to 2.9%, and made the
h2d pool's reserve exact on every row.

torch's allocated counter (max_memory_allocated) follows the host threads too, but counts a
block until the host drops its tensor, as its last user is enqueued, whichever stream that is:
record_stream defers the block's reuse, not the count. The ledger keeps that held count beside
the bytes in use; on the untied large-vocabulary rows it took the allocated peak's error from
+11-17% to within 5% (benchmarks/results/archive/validation_2026-12-03c, allocated_counter).
"""

from __future__ import annotations

from layerslide.planner.plan import Plan, runtime_buffer_id
from layerslide.simulator.allocator import CachingAllocatorModel
from layerslide.trace import TIERS, MemorySample

STATIC_POOL = "static"  # buffers allocated before the plan runs


class _Held:
    """One buffer through a run: where it counts, and its users left on each side (attributes
    rather than dicts by id: a run updates them at every one of its tasks' events)."""

    __slots__ = ("bytes", "host_left", "id", "other_left", "own_left", "pending", "pool", "tier")

    def __init__(self, buffer, pool: str):
        self.id, self.tier, self.bytes, self.pool = buffer.id, buffer.tier, buffer.bytes, pool
        self.pending = len(buffer.release_tasks)  # tasks yet to end before it goes
        # the allocator's side (GPU blocks): see MemoryLedger.__init__
        self.own_left = self.other_left = self.host_left = 0


class MemoryLedger:
    """Bytes in use per tier, GPU bytes per pool and the allocator's reserve, over a run.

    Bytes in use follow the tasks on their lanes (allocate, release). The allocator's model
    follows the host threads instead (dispatched, enqueued), as the caching allocator sees the
    requests: see the module's doc."""

    def __init__(self, plan: Plan, keep_samples: bool = True):
        self.in_use = dict.fromkeys(TIERS, 0)
        self.samples: list[MemorySample] = []  # each change, where kept (a trace's memory)
        self._keep_samples = keep_samples
        self.pool_in_use: dict[str, int] = {}
        self.pool_peaks: dict[str, int] = {}
        self.allocator = CachingAllocatorModel()
        # torch's allocated counter: a block counts from its request until the host drops its
        # tensor, once its last user is enqueued (record_stream defers reuse, not the count)
        self.held_bytes = 0
        self.held_peak_bytes = 0
        # each task's buffers, sorted once per run rather than at each of its events:
        # bytes in use: what comes as it starts, as it ends, and what it releases (with
        # whether before its outputs come: _goes_before_outputs)
        self._starts: dict[str, list[_Held]] = {}
        self._ends: dict[str, list[_Held]] = {}
        self._releases: dict[str, list[tuple[_Held, bool]]] = {}
        # the allocator's side (GPU blocks only; the rest it never sees): a block is free
        # again once its own lane's thread has enqueued its users there (stream order) and
        # its users on other streams have ended (their events), whichever comes last. Per
        # task: its requests as its dispatch begins and ends, (block, of its own lane) its
        # host drops before and after its outputs are requested, and the blocks of other
        # streams it is done with as it ends
        self._gpu_starts: dict[str, list[_Held]] = {}
        self._gpu_ends: dict[str, list[_Held]] = {}
        self._drops_first: dict[str, list[tuple[_Held, bool]]] = {}
        self._drops_last: dict[str, list[tuple[_Held, bool]]] = {}
        self._other_stream_users: dict[str, list[_Held]] = {}
        lanes = {tid: lane for lane, order in plan.lane_order.items() for tid in order}
        runtime = runtime_buffer_id("gpu")
        for b in plan.buffers:
            held = _Held(b, STATIC_POOL if b.alloc_task is None else lanes[b.alloc_task])
            if b.alloc_task is None:
                self._add_static(held)
                if b.tier == "gpu" and b.id != runtime:
                    self._request(held)
            else:
                made = self._ends if b.at_end else self._starts
                made.setdefault(b.alloc_task, []).append(held)
                if b.tier == "gpu":
                    made = self._gpu_ends if b.at_end else self._gpu_starts
                    made.setdefault(b.alloc_task, []).append(held)
            for t in b.release_tasks:
                self._add_release(held, self._goes_before_outputs(b, t), t, lanes[t])
        for tier in TIERS:
            self.samples.append(MemorySample(time_s=0.0, tier=tier, bytes_in_use=self.in_use[tier]))
        self.peaks = dict(self.in_use)  # each tier's most in use: its samples' largest

    def _add_release(self, held: _Held, before: bool, task_id: str, lane: str) -> None:
        """File the buffer under a task releasing it, on both sides (see __init__)."""
        self._releases.setdefault(task_id, []).append((held, before))
        if held.tier != "gpu":
            return
        own = lane == held.pool
        drops = self._drops_first if before else self._drops_last
        drops.setdefault(task_id, []).append((held, own))
        held.host_left += 1
        if own:
            held.own_left += 1
        else:
            held.other_left += 1
            self._other_stream_users.setdefault(task_id, []).append(held)

    def _add_static(self, held: _Held) -> None:
        """A buffer held before the plan runs: in use from the start (no sample, no peak yet)."""
        self.in_use[held.tier] += held.bytes
        if held.tier == "gpu":
            self._pool_add(held.pool, held.bytes)

    def _add(self, now: float, held: _Held) -> None:
        tier = held.tier
        used = self.in_use[tier] = self.in_use[tier] + held.bytes
        self.peaks[tier] = max(self.peaks[tier], used)
        if self._keep_samples:
            self.samples.append(MemorySample(time_s=now, tier=tier, bytes_in_use=used))
        if tier == "gpu":
            self._pool_add(held.pool, held.bytes)

    def _remove(self, now: float, held: _Held) -> None:
        """The buffer goes: no peak moves (each is at least what is in use)."""
        tier = held.tier
        used = self.in_use[tier] = self.in_use[tier] - held.bytes
        assert used >= 0, f"{tier} memory went negative"
        if self._keep_samples:
            self.samples.append(MemorySample(time_s=now, tier=tier, bytes_in_use=used))
        if tier == "gpu":
            self.pool_in_use[held.pool] -= held.bytes

    def _pool_add(self, pool: str, nbytes: int) -> None:
        used = self.pool_in_use[pool] = self.pool_in_use.get(pool, 0) + nbytes
        self.pool_peaks[pool] = max(self.pool_peaks.get(pool, 0), used)

    def _request(self, held: _Held) -> None:
        """A GPU block is requested: the allocator hands it out and torch counts it."""
        self.allocator.allocate(held.pool, held.id, held.bytes)
        self.held_bytes += held.bytes
        self.held_peak_bytes = max(self.held_peak_bytes, self.held_bytes)

    def allocate(self, now: float, task_id: str) -> None:
        """The task has started: its buffers other than its outputs come."""
        for held in self._starts.get(task_id, ()):
            self._add(now, held)

    def release(self, now: float, task_id: str) -> None:
        """The task has ended: its scratch goes, then its outputs come, then the inputs it was
        the last to release (see _goes_before_outputs; Plan.validate keeps a task from releasing its own
        outputs). Blocks it used from another stream are the allocator's again once their own
        stream's users are enqueued too (its event has completed)."""
        inputs = []
        for held, before in self._releases.get(task_id, ()):
            held.pending -= 1
            if held.pending == 0:
                if before:
                    self._remove(now, held)
                else:
                    inputs.append(held)
        for held in self._other_stream_users.get(task_id, ()):
            held.other_left -= 1
            self._free_if_unused(held)
        for held in self._ends.get(task_id, ()):
            self._add(now, held)
        for held in inputs:
            self._remove(now, held)

    def dispatched(self, now: float, task_id: str) -> None:
        """The task's host thread begins enqueueing it: its requests reach the allocator."""
        for held in self._gpu_starts.get(task_id, ()):
            self._request(held)

    def enqueued(self, now: float, task_id: str) -> None:
        """The task's host thread is done with it: the blocks of its own stream it was the
        last to use there go back (stream order makes them reusable at once) and the host
        drops its tensors, its scratch before its outputs are requested, its inputs after
        (see _goes_before_outputs)."""
        for held, own in self._drops_first.get(task_id, ()):
            self._dropped_by_host(held, own)
        for held in self._gpu_ends.get(task_id, ()):
            self._request(held)
        for held, own in self._drops_last.get(task_id, ()):
            self._dropped_by_host(held, own)

    def _dropped_by_host(self, held: _Held, own_lane: bool) -> None:
        """The host thread of a task releasing the GPU block is done with it (own_lane: that
        task is on the block's own stream)."""
        if own_lane:
            held.own_left -= 1
            self._free_if_unused(held)
        held.host_left -= 1
        if held.host_left == 0:
            self.held_bytes -= held.bytes

    def _free_if_unused(self, held: _Held) -> None:
        """The GPU block is the allocator's again once no user is left on either side."""
        if held.own_left == 0 and held.other_left == 0:
            self.allocator.free(held.id)

    @staticmethod
    def _goes_before_outputs(buffer, task_id: str) -> bool:
        """Whether a buffer the task releases goes before its outputs (Buffer.at_end) come: its
        scratch does, unless the task still holds it then (Buffer.outlives_outputs). The inputs it
        releases go after: the executor's task holds them until it returns (the sweep's fp32
        sum its last task rounds to bf16, a backward's checkpoint and incoming grad)."""
        return buffer.alloc_task == task_id and not buffer.outlives_outputs

    def gpu_pool_reserves(self) -> dict[str, int]:
        """What the caching allocator has reserved per pool so far (it never gives pages back
        while training)."""
        return self.allocator.reserved_bytes()
