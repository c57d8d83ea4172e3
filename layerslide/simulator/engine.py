"""Discrete-event run of a Plan in SimPy: one process per lane, fluid bandwidth sharing,
memory tracked per tier as buffers are allocated and released.

A strict lane is a CUDA stream fed by a host thread, as in the executor: the thread enqueues the
lane's tasks in order, each once its predecessors are enqueued (on a stream) or done (on a host
lane), taking the task's dispatch time (longer while the CPU lanes' kernels hold the cores it
needs: CostModel's HOST_CORES), with at most Policy.stream_run_ahead of them queued and
unfinished. The stream runs a task once its predecessors are done and its dispatch has begun,
and the task ends no sooner than its dispatch. So the dispatch of a task waiting for its inputs
(a layer's weights in flight) hides behind that wait. A task's buffers come as it starts (its
outputs as it ends) and go as the last task releasing them ends; the allocator's model sees them
as the host threads dispatch and enqueue (layerslide.simulator.memory)."""

from __future__ import annotations

import heapq

import simpy

from layerslide.planner.plan import Plan
from layerslide.simulator.costmodel import CostModel
from layerslide.simulator.memory import MemoryLedger
from layerslide.simulator.sharing import SharedResources
from layerslide.trace import Trace, TraceEvent


class _TaskState:
    __slots__ = ("cost", "dispatched", "end_s", "enqueued", "finished", "order", "ready",
                 "start_s", "task", "waiting_on")

    def __init__(self, task, cost, order: int, env: simpy.Environment):
        self.task = task
        self.cost = cost
        self.order = order  # position in its lane's order: the priority
        self.waiting_on = 0
        self.ready = env.event()  # every predecessor is done
        self.dispatched = env.event()  # its host thread began enqueueing it (strict lanes)
        self.enqueued = env.event()  # its host part is over: enqueued on a stream, or done
        self.finished = env.event()
        self.start_s = self.end_s = 0.0


def run_plan(plan: Plan, costs: CostModel) -> Trace:
    """Simulate the plan to completion and return its Trace; its meta has the GPU's peak bytes
    and the allocator's reserve per pool (gpu_pool_peak_bytes, gpu_pool_reserved_bytes)."""
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities(), costs.mixed_capacities())
    stream_lanes = {lane for lane, d in plan.lane_discipline.items() if d == "strict"}
    memory = MemoryLedger(plan)
    states: dict[str, _TaskState] = {}
    for lane, order in plan.lane_order.items():
        for i, tid in enumerate(order):
            states[tid] = _TaskState(plan.task(tid), costs.cost(plan.task(tid)), i, env)
    graph = plan.graph
    run_ahead = plan.policy.stream_run_ahead
    for tid, st in states.items():
        st.waiting_on = graph.in_degree(tid)
        if st.waiting_on == 0:
            st.ready.succeed()
    # Priority lanes keep a heap of ready tasks and a wake-up event for when one arrives.
    ready_heaps: dict[str, list] = {lane: [] for lane, d in plan.lane_discipline.items()
                                    if d == "priority"}
    lane_wakeups: dict[str, simpy.Event] = {lane: env.event() for lane in ready_heaps}

    def mark_ready(st: _TaskState) -> None:
        lane = st.task.lane
        if lane in ready_heaps:
            heapq.heappush(ready_heaps[lane], (st.order, st.task.id))
            if not lane_wakeups[lane].triggered:
                lane_wakeups[lane].succeed()
        elif not st.ready.triggered:
            st.ready.succeed()

    for st in states.values():
        if st.waiting_on == 0 and st.task.lane in ready_heaps:
            heapq.heappush(ready_heaps[st.task.lane], (st.order, st.task.id))

    def execute(st: _TaskState):
        st.start_s = env.now
        if st.task.lane not in stream_lanes:  # a host lane's task: dispatched as it starts
            memory.dispatched(env.now, st.task.id)
        memory.allocate(env.now, st.task.id)
        cost = st.cost
        if cost.solo_s > 0:
            if cost.uses:
                yield shared.run(cost.solo_s, cost.uses, cost.share, cost.tag)
            else:
                yield env.timeout(cost.solo_s)
        if st.task.lane in stream_lanes and not st.enqueued.triggered:
            yield st.enqueued  # its last kernels were still being launched
        st.end_s = env.now
        st.finished.succeed()
        if st.task.lane not in stream_lanes:  # a host lane's task: its host part is the task
            st.enqueued.succeed()
            memory.enqueued(env.now, st.task.id)
        memory.release(env.now, st.task.id)
        for succ in graph.successors(st.task.id):
            s2 = states[succ]
            s2.waiting_on -= 1
            if s2.waiting_on == 0:
                mark_ready(s2)

    def enqueue_thread(order):
        for i, tid in enumerate(order):
            st = states[tid]
            if run_ahead and i >= run_ahead:  # at most run_ahead queued and unfinished
                yield states[order[i - run_ahead]].finished
            yield env.all_of([states[p].enqueued for p in graph.predecessors(tid)])
            st.dispatched.succeed()
            memory.dispatched(env.now, tid)
            cost = st.cost
            if cost.dispatch_s > 0 and cost.dispatch_uses:
                yield shared.run(cost.dispatch_s, cost.dispatch_uses, 1.0)
            elif cost.dispatch_s > 0:
                yield env.timeout(cost.dispatch_s)
            st.enqueued.succeed()
            memory.enqueued(env.now, tid)

    def strict_lane(order):
        for tid in order:
            st = states[tid]
            yield st.ready & st.dispatched
            yield from execute(st)

    def priority_lane(lane, count):
        heap = ready_heaps[lane]
        for _ in range(count):
            while not heap:
                lane_wakeups[lane] = env.event()
                yield lane_wakeups[lane]
            _, tid = heapq.heappop(heap)
            yield from execute(states[tid])

    for lane, order in plan.lane_order.items():
        if not order:
            continue
        if plan.lane_discipline[lane] == "strict":
            env.process(enqueue_thread(order))
            env.process(strict_lane(order))
        else:
            env.process(priority_lane(lane, len(order)))
    env.run()
    unfinished = [tid for tid, st in states.items() if not st.finished.triggered]
    if unfinished:
        raise RuntimeError(f"simulation stalled with {len(unfinished)} tasks left, "
                           f"e.g. {unfinished[:3]}: the plan's lane orders deadlock")
    events = tuple(
        TraceEvent(task_id=st.task.id, lane=st.task.lane, kind=st.task.kind,
                   block=st.task.block, step=st.task.step, start_s=st.start_s, end_s=st.end_s)
        for st in sorted(states.values(), key=lambda s: (s.start_s, s.end_s))
    )
    meta = {"gpu_pool_peak_bytes": dict(memory.pool_peaks),
            "gpu_pool_reserved_bytes": memory.gpu_pool_reserves()}
    return Trace(source="simulated", label="", events=events, memory=tuple(memory.samples),
                 meta=meta)
