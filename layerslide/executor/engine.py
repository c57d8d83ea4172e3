"""Run a Plan's tasks on their lanes, ordered only by the plan's edges and lane orders.

One thread per lane. A strict lane (a CUDA stream) takes its tasks in lane order; a priority
lane (a CPU or I/O worker) takes the first task in lane order whose inputs are ready. An edge
between two stream lanes becomes a CUDA event the consumer's stream waits on; an edge from a
stream lane into a host lane makes the worker wait for that event. A stream lane's thread keeps
at most `run_ahead` of its tasks queued on the GPU (Plan.stream_run_ahead). The
engine knows nothing of what tasks do: `run_task` does the work (enqueued on the current stream).

Waiting for GPU work (Policy.executor.lane_waits): "poll" has each waiting thread query its
events every POLL_S; "watch" gives each stream lane a thread that sleeps on its tasks' end events
in turn (without the GIL) and wakes the threads waiting on them. A poll takes the GIL, and with
every core running the CPU kernels each hand-over waits for a core: the GPU lane's enqueue ran
1.4-2.5x slower beside AdamW (benchmarks/results/archive/validation_2026-12-04b).

Serial mode runs the same tasks one at a time in a topological order, synchronising the GPU
after each: the correctness oracle for the overlapped mode.
"""

from __future__ import annotations

import bisect
import queue
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import networkx as nx

from layerslide.executor import waits
from layerslide.executor.device import LaneDevice
from layerslide.kinds import STREAM_LANES
from layerslide.planner.plan import Plan, Task

POLL_S = 2e-4  # how often a worker rechecks GPU events it waits on (they cannot notify)
ABORT_CHECK_S = 0.5  # how often blocked threads look for another lane's failure
LANDED_POLL_S = 1e-3  # how often a step's reporter rechecks its last GPU work (off the lanes)
COMPUTE_LANE = "gpu"  # the lane whose thread runs the layers' GEMMs (and autograd's backward)
# While the lanes run, Python's GIL switch interval is the plan's
# (Policy.executor.lane_switch_interval_s; the interpreter's default is 5 ms): the CPU lane needs
# the GIL back between its optimizer calls, which another lane's thread may hold for up to the
# interval (benchmarks/results/archive/cpu_split_gil_2026-11-30).
# engines running at once share the process-wide interval: the first in sets it, the last out
# puts the caller's back
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved_s = 0.0


class TaskFailedError(RuntimeError):
    """A task raised: names the task; the original exception is the cause."""


@dataclass(frozen=True, kw_only=True)
class TaskTiming:
    """When one task ran, in seconds from the engine's time zero."""

    task: Task
    start_s: float
    end_s: float
    dispatch: tuple[float, float] | None = None  # a stream task's enqueue by its lane's thread


class PlanEngine:
    """Executes one plan once; `run` returns each task's timing."""

    def __init__(self, plan: Plan, device: LaneDevice, run_task: Callable[[Task], None], *,
                 serial: bool = False, on_step_done: Callable[[int], None] | None = None,
                 run_ahead: int | None = None, stop: threading.Event | None = None):
        self.plan, self.device, self.run_task, self.serial = plan, device, run_task, serial
        self.stop = stop  # once set, the run ends after the step in flight (_request_stop)
        self.on_step_done = on_step_done
        # the plan's bound, unless the caller says otherwise
        if run_ahead is None:
            run_ahead = plan.stream_run_ahead
        self.run_ahead = run_ahead
        if self.run_ahead < 0:
            raise ValueError(f"run_ahead={self.run_ahead}: must be >= 1 task, or 0 for no bound")
        # each stream lane's end events still counted against its run-ahead, oldest first
        self._in_flight: dict[str, deque] = {lane: deque() for lane in STREAM_LANES}
        # each lane thread's end, set last (not is_alive(): see executor.waits); the lanes
        # running, so that an interrupted run() returns only once none is
        self._lane_ended: dict[str, threading.Event] = {}
        self._lanes_busy, self._lanes_busy_changed = 0, threading.Condition()
        self._watch_ended: dict[str, threading.Event] = {}  # each watcher's end, set last
        # lane_waits "watch": each stream lane's enqueued (task, end event), for its watcher;
        # a stream task's flag once its GPU work is done; a lane's free run-ahead slots
        self.watch = plan.policy.executor.lane_waits == "watch"
        self._to_watch = {lane: queue.SimpleQueue() for lane in STREAM_LANES}
        self._landed = {tid: threading.Event() for tid in plan.graph
                        if self.watch and plan.task(tid).lane in STREAM_LANES}
        self._slots = {lane: threading.Semaphore(max(self.run_ahead, 1)) for lane in STREAM_LANES}
        self._step_left = Counter(plan.task(tid).step for tid in plan.graph)
        # each stream lane's last task of each step: the step has landed once they are done
        self._last_on_streams: dict[int, list[str]] = {step: [] for step in self._step_left}
        for lane in STREAM_LANES:
            last = {plan.task(tid).step: tid for tid in plan.lane_order.get(lane, ())}
            for step, tid in last.items():
                self._last_on_streams[step].append(tid)
        self._step_lock = threading.Lock()
        self.graph = plan.graph
        self._host_done = {tid: threading.Event() for tid in self.graph}
        self._end_event: dict[str, object] = {}
        self._timing: dict[str, tuple[object, object]] = {}
        self._dispatch: dict[str, tuple[float, float]] = {}  # host seconds, stream tasks
        self._error: tuple[str, BaseException] | None = None
        self._abort = threading.Event()
        # a graceful stop: tasks of steps after this one are skipped (see _request_stop)
        self._stop_after: int | None = None
        self._gpu_step = 0  # the step of the latest task begun on the compute lane
        # priority lanes: tasks whose predecessors have all run, kept in lane order
        self._rank = {tid: i for order in plan.lane_order.values() for i, tid in enumerate(order)}
        self._missing = {tid: self.graph.in_degree(tid) for tid in self.graph}
        self._ready: dict[str, list[tuple[int, str]]] = {}
        self._cond: dict[str, threading.Condition] = {}
        for lane, discipline in plan.lane_discipline.items():
            if discipline == "priority":
                self._cond[lane] = threading.Condition()
                self._ready[lane] = sorted((self._rank[t], t) for t in plan.lane_order[lane]
                                           if self._missing[t] == 0)

    # --- public ----------------------------------------------------------------------------------
    def run(self) -> list[TaskTiming]:
        if self.serial:
            self._run_serial()
        else:
            self._run_threads()
        self.device.synchronize()
        return self._timings()

    def _request_stop(self) -> int | None:
        """End the run after the step the GPU is in: later steps' tasks are skipped, none of
        which can have changed the training state, which only optimizer steps do once their
        step's backward has run. Returns that step, or None where the plan has no such cut
        (the whole run then goes on). Called by the lanes once `stop` is set (a signal handler
        sets it: it must not take the lock a lane may hold)."""
        with self._step_lock:
            if self._stop_after is None:
                self._stop_after = self._first_cut(self._gpu_step)
            stop = self._stop_after
        for cond in self._cond.values():
            with cond:
                cond.notify_all()
        return stop

    def wait_step_landed(self, step: int) -> bool:
        """Block until the GPU work of every task of `step` is done, once on_step_done(step)
        has come (its tasks are all enqueued, so their work ends); False where the run failed
        first. Another thread's wait: a lane never waits for a step to land."""
        for tid in self._last_on_streams[step]:  # a stream's work ends in its order
            landed = None if self.serial else self._landed.get(tid)  # serial: synchronised
            while not self._abort.is_set():
                if (landed.wait(ABORT_CHECK_S) if landed is not None
                        else self.device.is_done(self._end_event.get(tid))):
                    break
                if landed is None:
                    time.sleep(LANDED_POLL_S)
            else:
                return False
        return True

    def end_s(self, tid: str) -> float:
        """Seconds from time zero to the end of a task that has landed (wait_step_landed)."""
        end = self._timing[tid][1]
        return end if isinstance(end, float) else self.device.event_time_s(end)

    @property
    def stopped_after(self) -> int | None:
        """The last step run where a stop was requested, else None."""
        return self._stop_after

    def _first_cut(self, step: int) -> int | None:
        """The first step from `step` on after which the run can end: no task of it or before
        waits for a task of a later step (the last step is no cut: the run ends there)."""
        return next((k for k in range(step, max(self._step_left)) if self._cut_is_safe(k)), None)

    def _cut_is_safe(self, k: int) -> bool:
        return not any(self.plan.task(u).step > k >= self.plan.task(v).step
                       for u, v in self.graph.edges)

    def _skip_or_begin(self, task: Task) -> bool:
        """Whether a stop skips the task; a compute task that runs moves the GPU's step (under
        the lock, so that no step's first GPU task slips past the cut being chosen)."""
        if self.stop is None:  # nothing can ask this run to stop
            return False
        if task.lane != COMPUTE_LANE:
            return self._stop_after is not None and task.step > self._stop_after
        with self._step_lock:
            if self._stop_after is not None and task.step > self._stop_after:
                return True
            self._gpu_step = max(self._gpu_step, task.step)
            return False

    # --- overlapped ------------------------------------------------------------------------------
    def _run_threads(self) -> None:
        threads, self._lane_ended = [], {}
        for lane, order in self.plan.lane_order.items():
            if not order:
                continue
            target = (self._strict_worker if self.plan.lane_discipline[lane] == "strict"
                      else self._priority_worker)
            threads.append(threading.Thread(target=self._guard, args=(target, lane),
                                            name=f"layerslide-{lane}", daemon=True))
            self._lane_ended[lane] = threading.Event()
        watched = [lane for lane in STREAM_LANES if self.watch and self.plan.lane_order.get(lane)]
        watchers = [threading.Thread(target=self._watch_landings, args=(lane,),
                                     name=f"layerslide-{lane}-landings", daemon=True)
                    for lane in watched]
        self._watch_ended = {lane: threading.Event() for lane in watched}
        _enter_lane_switch_interval(self.plan.policy.executor.lane_switch_interval_s)
        try:
            started = []
            try:
                for t in watchers + threads:
                    t.start()
                    started.append(t)
                for lane in self._lane_ended:  # the main thread: a signal's handler runs meanwhile
                    waits.until(self._lane_ended[lane])
            except BaseException as exc:  # e.g. Ctrl-C: stop the lanes, then let it through
                self._fail("(interrupted)", exc)
                with self._lanes_busy_changed:  # a lane not yet begun will not begin now
                    while self._lanes_busy:
                        self._lanes_busy_changed.wait(waits.HEED_S)
                raise
            finally:
                for lane in STREAM_LANES:  # the watchers end once what was enqueued has landed
                    self._to_watch[lane].put(None)
                for lane, watcher in zip(watched, watchers, strict=True):
                    if watcher in started:
                        waits.until(self._watch_ended[lane])
        finally:
            _leave_lane_switch_interval()
        if self._error is not None:
            tid, exc = self._error
            raise TaskFailedError(f"task {tid} failed: {type(exc).__name__}: {exc}") from exc

    def _guard(self, worker: Callable[[str], None], lane: str) -> None:
        with self._lanes_busy_changed:
            if self._abort.is_set():  # run() was interrupted before this lane began
                self._lane_ended[lane].set()
                return
            self._lanes_busy += 1
        try:
            self.device.bind_thread()
            if lane == COMPUTE_LANE:
                self.device.prime_blas_workspaces(lane)
            worker(lane)
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 (a lane thread must hand every failure on)
            self._fail(f"(lane {lane})", exc)
        finally:
            with self._lanes_busy_changed:
                self._lanes_busy -= 1
                self._lanes_busy_changed.notify_all()
            self._lane_ended[lane].set()

    def _watch_landings(self, lane: str) -> None:
        """lane_waits "watch": sleep on each of the lane's end events in enqueue order (a
        stream's work ends in that order), then mark the task landed, free its run-ahead slot
        and wake the host lanes that take its outputs: one GIL hand-over per task, none while
        the GPU works."""
        try:
            self.device.bind_thread()
            while (item := self._to_watch[lane].get()) is not None:
                tid, event = item
                self.device.block_on(event)
                self._landed[tid].set()
                if self.run_ahead:
                    self._slots[lane].release()
                for succ_lane in {self.plan.task(s).lane for s in self.graph.successors(tid)}:
                    cond = self._cond.get(succ_lane)
                    if cond is not None:
                        with cond:
                            cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 (the lanes must hear of it, not hang)
            self._fail(f"(lane {lane}, landings)", exc)
        finally:
            self._watch_ended[lane].set()

    def _strict_worker(self, lane: str) -> None:
        for tid in self.plan.lane_order[lane]:
            self._execute(self.plan.task(tid))

    def _priority_worker(self, lane: str) -> None:
        cond, ready = self._cond[lane], self._ready[lane]
        for _ in range(len(self.plan.lane_order[lane])):
            with cond:
                while True:
                    self._check_abort()
                    pick = next((entry for entry in ready if self._inputs_landed(entry[1])), None)
                    if pick is not None:
                        ready.remove(pick)
                        break
                    # nothing ready: sleep until a predecessor finishes (or lands, watched),
                    # or poll GPU events
                    polling = ready and not self.watch
                    cond.wait(timeout=POLL_S if polling else ABORT_CHECK_S)
            self._execute(self.plan.task(pick[1]))

    def _inputs_landed(self, tid: str) -> bool:
        """All predecessors' GPU work is complete (their host part is, or tid is not ready)."""
        if self.watch:
            return all(p not in self._landed or self._landed[p].is_set()
                       for p in self.graph.predecessors(tid))
        return all(self.device.is_done(self._end_event.get(p))
                   for p in self.graph.predecessors(tid))

    def _execute(self, task: Task) -> None:
        if self.stop is not None and self.stop.is_set() and self._stop_after is None:
            self._request_stop()
        for pred in self.graph.predecessors(task.id):
            self._wait_host(pred)
        # a skip is decided once the inputs are in: a cut chosen meanwhile may have skipped them
        if self._skip_or_begin(task):
            if task.id in self._landed:  # nothing enqueued: it has landed, as far as any waits
                self._landed[task.id].set()
            self._host_done[task.id].set()
            self._release_successors(task.id)
            return
        on_stream = task.lane in STREAM_LANES
        if on_stream:
            self._wait_run_ahead(task.lane)
        for pred in self.graph.predecessors(task.id):
            event = self._end_event.get(pred)
            pred_lane = self.plan.task(pred).lane
            if on_stream and pred_lane != task.lane:
                self.device.wait(task.lane, event)
            elif not on_stream:
                self.device.block_on(event)
        try:
            if on_stream and self.device.is_cuda:
                began = self.device.host_now_s()  # the enqueue, timing markers included
                start = self.device.record(task.lane, timing=True)
                with self.device.on(task.lane):
                    self.run_task(task)
                # a watcher sleeps on the end event: a blocking one, or it spins a core
                end = self.device.record(task.lane, timing=True, blocking=self.watch)
                self._dispatch[task.id] = (began, self.device.host_now_s())
                self._end_event[task.id] = end
                if not self.watch:
                    self._in_flight[task.lane].append(end)
            else:
                start = self.device.host_now_s()
                with self.device.on(task.lane):
                    self.run_task(task)
                end = self.device.host_now_s()
                if on_stream:  # on the CPU device a stream task runs as it is enqueued
                    self._dispatch[task.id] = (start, end)
            if on_stream and self.watch:
                self._to_watch[task.lane].put((task.id, self._end_event.get(task.id)))
        except Exception as exc:
            self._fail(task.id, exc)
            raise _Aborted from exc
        self._timing[task.id] = (start, end)
        self._finish(task.id)

    def _wait_run_ahead(self, lane: str) -> None:
        """Block this lane's thread while `run_ahead` of its tasks are queued and unfinished."""
        if self.watch:
            while self.run_ahead and not self._slots[lane].acquire(timeout=ABORT_CHECK_S):
                self._check_abort()
            return
        queued = self._in_flight[lane]
        while queued and self.device.is_done(queued[0]):
            queued.popleft()
        if not self.run_ahead:
            return
        while len(queued) >= self.run_ahead:
            self._check_abort()
            if self.device.is_done(queued[0]):
                queued.popleft()
            else:
                time.sleep(POLL_S)

    def _finish(self, tid: str) -> None:
        self._host_done[tid].set()
        self._count_step(tid)
        self._release_successors(tid)

    def _release_successors(self, tid: str) -> None:
        for succ in self.graph.successors(tid):
            lane = self.plan.task(succ).lane
            cond = self._cond.get(lane)
            if cond is None:
                continue
            with cond:
                self._missing[succ] -= 1
                if self._missing[succ] == 0:
                    bisect.insort(self._ready[lane], (self._rank[succ], succ))
                    cond.notify()

    def _count_step(self, tid: str) -> None:
        """Report a step once all its tasks have run on the host (the GPU work of its last GPU
        tasks, e.g. GPU-updated blocks' optimizer steps, may still be in flight)."""
        step = self.plan.task(tid).step
        with self._step_lock:
            self._step_left[step] -= 1
            done = self._step_left[step] == 0
        if done and self.on_step_done is not None:
            self.on_step_done(step)

    def _wait_host(self, tid: str) -> None:
        while not self._host_done[tid].wait(timeout=ABORT_CHECK_S):
            self._check_abort()

    def _check_abort(self) -> None:
        if self._abort.is_set():
            raise _Aborted

    def _fail(self, tid: str, exc: BaseException) -> None:
        if self._error is None:
            self._error = (tid, exc)
        self._abort.set()
        for cond in self._cond.values():
            with cond:
                cond.notify_all()

    # --- serial ----------------------------------------------------------------------------------
    def _run_serial(self) -> None:
        self.device.prime_blas_workspaces(COMPUTE_LANE)
        combined = nx.DiGraph(self.graph.edges)
        combined.add_nodes_from(self.graph.nodes)
        for lane, order in self.plan.lane_order.items():
            if self.plan.lane_discipline[lane] == "strict":
                combined.add_edges_from(pairwise(order))
        key = {tid: f"{self._rank[tid]:09d}{self.plan.task(tid).lane}" for tid in self.graph}
        for tid in nx.lexicographical_topological_sort(combined, key=key.__getitem__):
            task = self.plan.task(tid)
            if self.stop is not None and self.stop.is_set() and self._stop_after is None:
                self._request_stop()
            if self._skip_or_begin(task):
                continue
            start = self.device.host_now_s()
            try:
                with self.device.on(task.lane):
                    self.run_task(task)
                self.device.synchronize()
            except Exception as exc:
                raise TaskFailedError(f"task {tid} failed: {type(exc).__name__}: {exc}") from exc
            self._timing[tid] = (start, self.device.host_now_s())
            self._host_done[tid].set()
            self._count_step(tid)

    # --- timings ---------------------------------------------------------------------------------
    def _timings(self) -> list[TaskTiming]:
        out = []
        for tid, (start, end) in self._timing.items():
            if not isinstance(start, float):  # CUDA timing events
                start, end = self.device.event_time_s(start), self.device.event_time_s(end)
            out.append(TaskTiming(task=self.plan.task(tid), start_s=start, end_s=end,
                                  dispatch=self._dispatch.get(tid)))
        return sorted(out, key=lambda t: t.start_s)


def _enter_lane_switch_interval(interval_s: float) -> None:
    global _switch_users, _switch_saved_s
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved_s = sys.getswitchinterval()
        _switch_users += 1
        sys.setswitchinterval(interval_s)


def _leave_lane_switch_interval() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        if _switch_users == 0:
            sys.setswitchinterval(_switch_saved_s)


class _Aborted(Exception):
    """Another lane failed: stop this one quietly (the failure is reported once)."""
