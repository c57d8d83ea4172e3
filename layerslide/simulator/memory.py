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
        self._pending: dict[str, int] = {}
        self._pool: dict[str, str] = {}
        # torch's allocated counter: a block counts from its request until the host drops its
        # tensor, once its last user is enqueued (record_stream defers reuse, not the count)
        self.held_bytes = 0
        self.held_peak_bytes = 0
        # the allocator's side: a GPU block is free again once its own lane's thread has
        # enqueued its users there (stream order) and its users on other streams have ended
        # (their events), whichever comes last
        self._own_users_left: dict[str, int] = {}
        self._other_users_left: dict[str, int] = {}
        self._host_users_left: dict[str, int] = {}
        # each task's buffers, sorted once per run rather than at each of its events:
        # bytes in use: what comes as it starts, as it ends, and what it releases (with
        # whether before its outputs come: _goes_before_outputs)
        self._starts: dict[str, list] = {}
        self._ends: dict[str, list] = {}
        self._releases: dict[str, list[tuple]] = {}
        # the allocator's (GPU blocks only; the rest it never sees): requests as its dispatch
        # begins and ends, (block, of its own lane) its host drops before and after its
        # outputs are requested, and blocks of other streams it is done with as it ends
        self._gpu_starts: dict[str, list] = {}
        self._gpu_ends: dict[str, list] = {}
        self._drops_first: dict[str, list[tuple]] = {}
        self._drops_last: dict[str, list[tuple]] = {}
        self._other_stream_users: dict[str, list] = {}
        lanes = {tid: lane for lane, order in plan.lane_order.items() for tid in order}
        runtime = runtime_buffer_id("gpu")
        for b in plan.buffers:
            if b.alloc_task is None:
                self._pool[b.id] = STATIC_POOL
                self._add_static(b)
                if b.tier == "gpu" and b.id != runtime:
                    self._request(b)
            else:
                self._pool[b.id] = lanes[b.alloc_task]
                made = self._ends if b.at_end else self._starts
                made.setdefault(b.alloc_task, []).append(b)
                if b.tier == "gpu":
                    made = self._gpu_ends if b.at_end else self._gpu_starts
                    made.setdefault(b.alloc_task, []).append(b)
            if b.release_tasks:
                self._pending[b.id] = len(b.release_tasks)
            if b.release_tasks and b.tier == "gpu":
                self._own_users_left[b.id] = self._other_users_left[b.id] = 0
                self._host_users_left[b.id] = 0
            for t in b.release_tasks:
                self._add_release(b, t, lanes[t])
        for tier in TIERS:
            self.samples.append(MemorySample(time_s=0.0, tier=tier, bytes_in_use=self.in_use[tier]))
        self.peaks = dict(self.in_use)  # each tier's most in use: its samples' largest

    def _add_release(self, buffer, task_id: str, lane: str) -> None:
        """File the buffer under the task releasing it, on both sides (see __init__)."""
        before = self._goes_before_outputs(buffer, task_id)
        self._releases.setdefault(task_id, []).append((buffer, before))
        if buffer.tier != "gpu":
            return
        own = lane == self._pool[buffer.id]
        drops = self._drops_first if before else self._drops_last
        drops.setdefault(task_id, []).append((buffer, own))
        self._host_users_left[buffer.id] += 1
        (self._own_users_left if own else self._other_users_left)[buffer.id] += 1
        if not own:
            self._other_stream_users.setdefault(task_id, []).append(buffer)

    def _add_static(self, buffer) -> None:
        """A buffer held before the plan runs: in use from the start (no sample, no peak yet)."""
        self.in_use[buffer.tier] += buffer.bytes
        if buffer.tier == "gpu":
            self._pool_add(buffer.id, buffer.bytes)

    def _add(self, now: float, buffer) -> None:
        tier = buffer.tier
        used = self.in_use[tier] = self.in_use[tier] + buffer.bytes
        self.peaks[tier] = max(self.peaks[tier], used)
        if self._keep_samples:
            self.samples.append(MemorySample(time_s=now, tier=tier, bytes_in_use=used))
        if tier == "gpu":
            self._pool_add(buffer.id, buffer.bytes)

    def _remove(self, now: float, buffer) -> None:
        """The buffer goes: no peak moves (each is at least what is in use)."""
        tier = buffer.tier
        used = self.in_use[tier] = self.in_use[tier] - buffer.bytes
        assert used >= 0, f"{tier} memory went negative"
        if self._keep_samples:
            self.samples.append(MemorySample(time_s=now, tier=tier, bytes_in_use=used))
        if tier == "gpu":
            pool = self._pool[buffer.id]
            self.pool_in_use[pool] -= buffer.bytes

    def _pool_add(self, buffer_id: str, nbytes: int) -> None:
        pool = self._pool[buffer_id]
        used = self.pool_in_use[pool] = self.pool_in_use.get(pool, 0) + nbytes
        self.pool_peaks[pool] = max(self.pool_peaks.get(pool, 0), used)

    def _request(self, buffer) -> None:
        """A GPU block is requested: the allocator hands it out and torch counts it."""
        self.allocator.allocate(self._pool[buffer.id], buffer.id, buffer.bytes)
        self.held_bytes += buffer.bytes
        self.held_peak_bytes = max(self.held_peak_bytes, self.held_bytes)

    def _user_done(self, buffer, left: dict[str, int]) -> None:
        """One of the GPU block's users is done in the allocator's eyes (see __init__)."""
        left[buffer.id] -= 1
        if self._own_users_left[buffer.id] == 0 and self._other_users_left[buffer.id] == 0:
            self.allocator.free(buffer.id)

    def allocate(self, now: float, task_id: str) -> None:
        """The task has started: its buffers other than its outputs come."""
        for b in self._starts.get(task_id, ()):
            self._add(now, b)

    def release(self, now: float, task_id: str) -> None:
        """The task has ended: its scratch goes, then its outputs come, then the inputs it was
        the last to release (see _goes_before_outputs; Plan.validate keeps a task from releasing its own
        outputs). Blocks it used from another stream are the allocator's again once their own
        stream's users are enqueued too (its event has completed)."""
        inputs = []
        pending = self._pending
        for b, before in self._releases.get(task_id, ()):
            pending[b.id] -= 1
            if pending[b.id] == 0:
                if before:
                    self._remove(now, b)
                else:
                    inputs.append(b)
        for b in self._other_stream_users.get(task_id, ()):
            self._user_done(b, self._other_users_left)
        for b in self._ends.get(task_id, ()):
            self._add(now, b)
        for b in inputs:
            self._remove(now, b)

    def dispatched(self, now: float, task_id: str) -> None:
        """The task's host thread begins enqueueing it: its requests reach the allocator."""
        for b in self._gpu_starts.get(task_id, ()):
            self._request(b)

    def enqueued(self, now: float, task_id: str) -> None:
        """The task's host thread is done with it: the blocks of its own stream it was the
        last to use there go back (stream order makes them reusable at once) and the host
        drops its tensors, its scratch before its outputs are requested, its inputs after
        (see _goes_before_outputs)."""
        for b, own in self._drops_first.get(task_id, ()):
            self._dropped_by_host(b, own)
        for b in self._gpu_ends.get(task_id, ()):
            self._request(b)
        for b, own in self._drops_last.get(task_id, ()):
            self._dropped_by_host(b, own)

    def _dropped_by_host(self, buffer, own_lane: bool) -> None:
        """The host thread of a task releasing the GPU block is done with it (own_lane: that
        task is on the block's own stream)."""
        if own_lane:
            self._user_done(buffer, self._own_users_left)
        self._host_users_left[buffer.id] -= 1
        if self._host_users_left[buffer.id] == 0:
            self.held_bytes -= buffer.bytes

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
