"""Discrete-event run of a Plan (on simulator.kernel, SimPy's semantics): one process per lane, fluid bandwidth sharing,
memory tracked per tier as buffers are allocated and released.

A strict lane is a CUDA stream fed by a host thread, as in the executor: the thread enqueues the
lane's tasks in order, each once its predecessors are enqueued (on a stream) or done (on a host
lane), taking the task's dispatch time (longer while the CPU lanes' kernels hold the cores it
needs: CostModel's HOST_CORES), with at most Plan.stream_run_ahead of them queued and
unfinished. The stream runs a task once its predecessors are done and its dispatch has begun,
and the task ends no sooner than its dispatch. So the dispatch of a task waiting for its inputs
(a layer's weights in flight) hides behind that wait. A task's buffers come as it starts (its
outputs as it ends) and go as the last task releasing them ends; the allocator's model sees them
as the host threads dispatch and enqueue (layerslide.simulator.memory)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, fields
from itertools import takewhile
from operator import attrgetter

from layerslide.planner.plan import Plan
from layerslide.simulator import native as native_engine
from layerslide.simulator.costmodel import CostModel
from layerslide.simulator.kernel import Event, Kernel
from layerslide.simulator.memory import MemoryLedger
from layerslide.simulator.sharing import SharedResources
from layerslide.trace import Trace, TraceEvent


class _TaskState:
    __slots__ = ("cost", "dispatched", "end_s", "enqueue_window", "enqueued", "finished",
                 "order", "predecessors_enqueued", "ready", "start_s", "successors", "task",
                 "waiting_on")

    def __init__(self, task, cost, order: int, env: Kernel, on_stream: bool):
        self.task = task
        self.cost = cost
        self.order = order  # position in its lane's order: the priority
        self.waiting_on = 0
        self.enqueued = env.event()  # its host part is over: enqueued on a stream, or done
        # what only a stream waits for: every predecessor done, its host thread begun
        # enqueueing it, and (the run-ahead) an earlier task finished; a worker's task has
        # none (an event nothing waits for is left out: the others keep their order)
        self.ready = env.event() if on_stream else None
        self.dispatched = env.event() if on_stream else None
        self.finished = env.event() if on_stream else None
        self.end_s: float | None = None  # None until it has ended
        self.start_s = 0.0
        # a stream task's enqueue by its host thread: (begun, done) in seconds
        self.enqueue_window: tuple[float, float] | None = None
        # the graph's edges as the states they lead to and the events they wait for, in the
        # graph's order (looked up once, not at every event)
        self.successors: list[_TaskState] = []
        self.predecessors_enqueued: list[Event] = []


def run_plan(plan: Plan, costs: CostModel, keep_memory: bool = True,
             environment: type = Kernel) -> Trace:
    """Simulate the plan to completion and return its Trace; its meta has each tier's peak
    bytes (peak_bytes), the GPU's per pool and the allocator's reserve per pool
    (gpu_pool_peak_bytes, gpu_pool_reserved_bytes). keep_memory=False leaves the memory
    samples out of the trace (a search reads only the peaks). environment: the event kernel's
    class (simpy.Environment runs it alike: benchmarks/sim_speed.py times the two)."""
    return simulate_run(plan, costs, keep_memory, environment=environment).trace


@dataclass(frozen=True)
class SimulatedRun:
    """A run's trace (without events where they were not kept), the end of each of the plan's
    step markers, and each lane's (start_s, end_s) in the order its tasks ran (one at a time),
    the lanes in the order they first appear in the trace."""

    trace: Trace
    marker_ends_s: list[float]
    spans: dict[str, list[tuple[float, float]]]


def simulate_run(plan: Plan, costs: CostModel, keep_memory: bool = True,
                 keep_events: bool = True, environment: type = Kernel,
                 native: bool = True) -> SimulatedRun:
    """run_plan's run, with what a steady step is read off; keep_events=False leaves the
    trace's events out (a search reads only the spans: making and sorting an event per task
    was ~7% of a simulation). A run with neither events nor memory samples goes to the C
    engine where it is built (simulator.native: the same run), unless native=False."""
    if native and not keep_events and not keep_memory and environment is Kernel:
        ran = native_engine.simulate(plan, costs)
        if ran is not None:
            trace, markers, lane_runs = ran
            return SimulatedRun(trace=trace, marker_ends_s=markers,
                                spans=in_trace_order(lane_runs))
    run = _PlanRun(plan, costs, keep_memory, environment)
    try:
        trace = run.run(keep_events)
        markers = [run.states[tid].end_s for tid in plan.meta.get("step_markers", ())]
        return SimulatedRun(trace=trace, marker_ends_s=markers,
                            spans=in_trace_order(run.lane_runs()))
    finally:
        run.close()


def in_trace_order(lane_runs: dict[str, tuple[list[tuple[float, float]], list[int]]],
                   ) -> dict[str, list[tuple[float, float]]]:
    """Each lane's spans (its runs' (start_s, end_s) in the order it ran them, beside their
    tasks' numbers in lane order), the lanes in the order their first event takes in a trace:
    by start, end, then number, among the tasks each lane started first (several only if
    they took no time)."""
    def first(lane: str) -> tuple[float, float, int]:
        spans, numbers = lane_runs[lane]
        lead = spans[0][0]
        return min((start, end, number) for (start, end), number in
                   takewhile(lambda run: run[0][0] == lead, zip(spans, numbers)))
    return {lane: lane_runs[lane][0] for lane in sorted(lane_runs, key=first)}


class _PlanRun:
    """One simulation: the tasks' states, the shared resources and memory, and the lanes."""

    def __init__(self, plan: Plan, costs: CostModel, keep_memory: bool = True,
                 environment: type = Kernel):
        self.plan, self.graph = plan, plan.graph
        self.env = env = environment()
        self.shared = SharedResources(env, costs.capacities(), costs.mixed_capacities())
        self.memory = MemoryLedger(plan, keep_samples=keep_memory)
        self.states: dict[str, _TaskState] = {}
        # the graph's node data and adjacency dicts, not their views (one view per lookup)
        nodes, cost = self.graph._node, costs.cost
        for lane, order in plan.lane_order.items():
            on_stream = plan.lane_discipline[lane] == "strict"
            for i, tid in enumerate(order):
                task = nodes[tid]["task"]
                self.states[tid] = _TaskState(task, cost(task), i, env, on_stream)
        states, succ, pred = self.states, self.graph._succ, self.graph._pred
        for tid, st in states.items():
            st.successors = [states[s] for s in succ[tid]]
            st.predecessors_enqueued = [states[p].enqueued for p in pred[tid]]
            st.waiting_on = len(st.predecessors_enqueued)
            if st.waiting_on == 0 and st.ready is not None:
                st.ready.succeed()
        self.workers = {lane: WorkerLane(self, lane) for lane, d in plan.lane_discipline.items()
                        if d == "priority"}
        for st in self.states.values():
            if st.waiting_on == 0 and st.task.lane in self.workers:
                self.workers[st.task.lane].push(st)

    def close(self) -> None:
        """Break the run's reference cycles (its workers refer to it): refcounting then frees
        its states and events at once."""
        self.workers.clear()
        # what an error left scheduled (simpy.Environment keeps its queue as _queue)
        getattr(self.env, "queue", getattr(self.env, "_queue", [])).clear()

    def run(self, keep_events: bool = True) -> Trace:
        for lane, order in self.plan.lane_order.items():
            if not order:
                continue
            if self.plan.lane_discipline[lane] == "strict":
                StreamLane(self, order, self.plan.stream_run_ahead)
            else:
                self.workers[lane].start(len(order))
        self.env.run()
        unfinished = [tid for tid, st in self.states.items() if st.end_s is None]
        if unfinished:
            raise RuntimeError(f"simulation stalled with {len(unfinished)} tasks left, "
                               f"e.g. {unfinished[:3]}: the plan's lane orders deadlock")
        events = (tuple(map(_trace_event, sorted(self.states.values(), key=_BY_START_END)))
                  if keep_events else ())
        meta = {"peak_bytes": dict(self.memory.peaks),
                "gpu_held_peak_bytes": self.memory.held_peak_bytes,
                "gpu_pool_peak_bytes": dict(self.memory.pool_peaks),
                "gpu_pool_reserved_bytes": self.memory.gpu_pool_reserves()}
        return Trace(source="simulated", label="", events=events,
                     memory=tuple(self.memory.samples), meta=meta)

    def lane_runs(self) -> dict[str, tuple[list[tuple[float, float]], list[int]]]:
        """Each lane that ran tasks: their (start_s, end_s) in the order it ran them, and their
        numbers in lane order (in_trace_order's input)."""
        runs, index = {}, 0
        for lane, order in self.plan.lane_order.items():
            worker = self.workers.get(lane)
            tasks = worker.ran if worker is not None else [self.states[t] for t in order]
            if tasks:
                runs[lane] = ([(st.start_s, st.end_s) for st in tasks],
                              [index + st.order for st in tasks])
            index += len(order)
        return runs

    def execute(self, st: _TaskState, on_stream: bool):
        """Run one task on its lane (a process step): its buffers, its work on the shared
        resources, then its successors' readiness."""
        env, memory = self.env, self.memory
        st.start_s = env.now
        if not on_stream:  # a host lane's task: dispatched as it starts
            memory.dispatched(env.now, st.task.id)
        memory.allocate(env.now, st.task.id)
        cost = st.cost
        if cost.solo_s > 0:
            if cost.uses:
                yield self.shared.run(cost.solo_s, cost.uses, cost.share, cost.tag)
            else:
                yield env.timeout(cost.solo_s)
        if on_stream and not st.enqueued.triggered:
            yield st.enqueued  # its last kernels were still being launched
        st.end_s = env.now
        if on_stream:
            st.finished.succeed()
        else:  # a host lane's task: its host part is the task
            st.enqueued.succeed()
            memory.enqueued(env.now, st.task.id)
        memory.release(env.now, st.task.id)
        for s2 in st.successors:
            s2.waiting_on -= 1
            if s2.waiting_on == 0:
                self._mark_ready(s2)

    def _mark_ready(self, st: _TaskState) -> None:
        worker = self.workers.get(st.task.lane)
        if worker is not None:
            worker.push(st)
        elif not st.ready.triggered:
            st.ready.succeed()


_BY_START_END = attrgetter("start_s", "end_s")  # a trace's order
_TRACE_EVENT_FIELDS = {"task_id", "lane", "kind", "block", "step", "start_s", "end_s",
                       "dispatch_start_s", "dispatch_end_s"}
assert _TRACE_EVENT_FIELDS == {f.name for f in fields(TraceEvent)}, "_trace_event fills them all"


def _trace_event(st: _TaskState) -> TraceEvent:
    """The task's TraceEvent, made without the frozen dataclass's setattr per field (a
    simulation makes one per task): TraceEvent has no __post_init__."""
    task, window = st.task, st.enqueue_window or (None, None)
    event = object.__new__(TraceEvent)
    vars(event).update({"task_id": task.id, "lane": task.lane, "kind": task.kind,
                        "block": task.block, "step": task.step, "start_s": st.start_s,
                        "end_s": st.end_s, "dispatch_start_s": window[0],
                        "dispatch_end_s": window[1]})
    return event


class StreamLane:
    """A CUDA stream and the host thread that feeds it, two processes: the thread enqueues the
    lane's tasks in order (each once its predecessors are enqueued or done, at most run_ahead
    queued and unfinished), the stream runs each once it is ready and its dispatch has begun."""

    def __init__(self, run: _PlanRun, order: tuple[str, ...], run_ahead: int):
        self.run, self.order, self.run_ahead = run, order, run_ahead
        run.env.process(self.host_thread())
        run.env.process(self.stream())

    def host_thread(self):
        run, env = self.run, self.run.env
        for i, tid in enumerate(self.order):
            st = run.states[tid]
            if self.run_ahead and i >= self.run_ahead:
                yield run.states[self.order[i - self.run_ahead]].finished
            yield env.all_of(st.predecessors_enqueued)
            st.dispatched.succeed()
            run.memory.dispatched(env.now, tid)
            began = env.now
            cost = st.cost
            if cost.dispatch_s > 0 and cost.dispatch_uses:
                yield run.shared.run(cost.dispatch_s, cost.dispatch_uses, cost.dispatch_share)
            elif cost.dispatch_s > 0:
                yield env.timeout(cost.dispatch_s)
            st.enqueue_window = (began, env.now)
            st.enqueued.succeed()
            run.memory.enqueued(env.now, tid)

    def stream(self):
        for tid in self.order:
            st = self.run.states[tid]
            yield st.ready & st.dispatched
            yield from self.run.execute(st, on_stream=True)


class WorkerLane:
    """A worker (CPU optimizer or cast, NVMe I/O) that runs the earliest ready task in its
    lane's order next: a heap of ready tasks and a wake-up event for when one arrives."""

    def __init__(self, run: _PlanRun, lane: str):
        self.run, self.lane = run, lane
        self.heap: list[tuple[int, str]] = []
        self.ran: list[_TaskState] = []  # its tasks in the order they ran
        self.wakeup = run.env.event()

    def push(self, st: _TaskState) -> None:
        heapq.heappush(self.heap, (st.order, st.task.id))
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def start(self, count: int) -> None:
        self.run.env.process(self.work(count))

    def work(self, count: int):
        for _ in range(count):
            while not self.heap:
                self.wakeup = self.run.env.event()
                yield self.wakeup
            _, tid = heapq.heappop(self.heap)
            st = self.run.states[tid]
            self.ran.append(st)
            yield from self.run.execute(st, on_stream=False)
