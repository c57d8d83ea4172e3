"""PlanEngine on the CPU: lane orders, dependencies, failures that stop every lane."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import replace

import networkx as nx
import pytest
from helpers import make_tiny_model

from layerslide.executor.device import LaneDevice
from layerslide.executor.engine import PlanEngine, TaskFailedError
from layerslide.kinds import STREAM_LANES
from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.planner.plan import task_id

PLAN = build_plan(make_tiny_model(3), TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
                  Policy.of(cast_worker=True, cpu_optimizer="torch"), num_steps=3)
# the same plan, its lanes told of finished GPU work by a watcher per stream lane
WATCHED = replace(PLAN, policy=PLAN.policy.with_(lane_waits="watch"))


def run_in_thread(fn, timeout_s: float = 60.0):
    """Run fn on a thread; fail (instead of hanging the suite) if it does not return."""
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the engine hung"
    return outcome


@pytest.mark.parametrize(("plan", "serial"), [(PLAN, False), (PLAN, True), (WATCHED, False)])
def test_every_task_runs_once_after_its_inputs_and_strict_lanes_keep_their_order(plan, serial):
    ran, lock = [], threading.Lock()

    def run_task(task):
        with lock:
            ran.append(task.id)

    timings = PlanEngine(plan, LaneDevice("cpu"), run_task, serial=serial).run()
    assert sorted(ran) == sorted(PLAN.graph.nodes)
    position = {tid: i for i, tid in enumerate(ran)}
    assert all(position[u] < position[v] for u, v in PLAN.graph.edges)
    for lane in ("gpu", "h2d", "d2h"):
        order = [t for t in ran if PLAN.task(t).lane == lane]
        assert order == list(PLAN.lane_order[lane])
    end = {t.task.id: t.end_s for t in timings}
    start = {t.task.id: t.start_s for t in timings}
    assert all(end[u] <= start[v] for u, v in PLAN.graph.edges)


def test_stream_tasks_keep_their_enqueue_and_host_lane_tasks_none():
    # on the CPU device a stream task runs in its lane's thread as it is enqueued
    timings = PlanEngine(PLAN, LaneDevice("cpu"), lambda task: None).run()
    strict = [t for t in timings if PLAN.lane_discipline[t.task.lane] == "strict"]
    assert strict and all(t.dispatch == (t.start_s, t.end_s) for t in strict)
    assert all(t.dispatch is None for t in timings if t not in strict)


@pytest.mark.parametrize(("plan", "serial"), [(PLAN, False), (PLAN, True), (WATCHED, False)])
def test_a_failing_task_is_named_and_stops_every_lane(plan, serial):
    victim = task_id(kind="backward", block=1, step=1, micro_batch=1,
                     num_layers=plan.model.num_layers)

    def run_task(task):
        if task.id == victim:
            raise RuntimeError("boom")

    engine = PlanEngine(plan, LaneDevice("cpu"), run_task, serial=serial)
    outcome = run_in_thread(engine.run)
    assert isinstance(outcome.get("error"), TaskFailedError)
    assert victim in str(outcome["error"]) and "boom" in str(outcome["error"])
    # nothing that depends on the failed task ran
    assert not any(d in engine._timing for d in nx.descendants(PLAN.graph, victim))


def test_a_failing_callback_stops_the_lanes_instead_of_hanging():
    def on_step_done(step):
        raise ValueError("callback broke")

    engine = PlanEngine(PLAN, LaneDevice("cpu"), lambda task: None, on_step_done=on_step_done)
    outcome = run_in_thread(engine.run)
    assert isinstance(outcome.get("error"), TaskFailedError)
    assert "callback broke" in str(outcome["error"])


def test_priority_lanes_pick_the_earliest_ready_task_in_lane_order():
    # with every task instantaneous, the CPU lane's tasks become ready in plan order
    # far more often than not; check the lane never runs a later task while an earlier
    # one was already ready when it picked
    ran, lock = [], threading.Lock()

    def run_task(task):
        with lock:
            ran.append(task.id)

    PlanEngine(PLAN, LaneDevice("cpu"), run_task).run()
    cpu = [t for t in ran if PLAN.task(t).lane == "cpu"]
    rank = {t: i for i, t in enumerate(PLAN.lane_order["cpu"])}
    position = {t: i for i, t in enumerate(ran)}
    for i, tid in enumerate(cpu):
        for earlier in PLAN.lane_order["cpu"][:rank[tid]]:
            if position[earlier] > position[tid]:  # ran later although earlier in order:
                # it cannot have been ready: one of its inputs finished after tid started
                assert any(position[p] > position[tid] for p in PLAN.graph.predecessors(earlier))


def test_lanes_run_under_a_short_gil_switch_interval_which_is_put_back_after():
    """The CPU lane gets the GIL back sooner between its optimizer calls while the lanes run;
    the caller's interval is restored afterwards, also when a task fails. The interval is the
    plan's (Policy.executor)."""
    LANE_SWITCH_INTERVAL_S = PLAN.policy.executor.lane_switch_interval_s

    before = sys.getswitchinterval()
    assert before != pytest.approx(LANE_SWITCH_INTERVAL_S)
    seen = set()
    failing = task_id(kind="backward", block=0, step=2, micro_batch=0,
                      num_layers=PLAN.model.num_layers)

    def run_task(task):
        seen.add(sys.getswitchinterval())
        if task.id == failing:
            raise RuntimeError("boom")

    with pytest.raises(TaskFailedError):
        PlanEngine(PLAN, LaneDevice("cpu"), run_task).run()
    assert len(seen) == 1 and seen.pop() == pytest.approx(LANE_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before


def test_engines_running_at_once_put_the_callers_interval_back_once_both_are_done():
    """The interval is process-wide: the first engine in sets it, the last one out restores
    it, however the two overlap."""
    LANE_SWITCH_INTERVAL_S = PLAN.policy.executor.lane_switch_interval_s

    before = sys.getswitchinterval()
    first_started, second_done = threading.Event(), threading.Event()

    def slow_task(task):
        first_started.set()
        second_done.wait(timeout=30)

    first = PlanEngine(PLAN, LaneDevice("cpu"), slow_task)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(timings=first.run()))
    runner.start()
    assert first_started.wait(timeout=30)
    PlanEngine(PLAN, LaneDevice("cpu"), lambda task: None).run()  # starts and ends inside it
    assert sys.getswitchinterval() == pytest.approx(LANE_SWITCH_INTERVAL_S)  # first still runs
    second_done.set()
    runner.join(timeout=60)
    assert "timings" in outcome
    assert sys.getswitchinterval() == before


class _QueuedGpu:
    """A stand-in for a GPU on the CPU: each stream lane's events complete in order, one every
    `period_s`, on a thread. The engine records a start and an end event per task; at each end
    it notes how many of the lane's tasks are queued and unfinished (end events not done)."""

    is_cuda = True

    def __init__(self, period_s: float = 1e-3):
        self.queues = {lane: [] for lane in ("gpu", "h2d", "d2h")}
        self.waits = {lane: [] for lane in self.queues}  # events the lane's next work waits on
        self.most_queued = dict.fromkeys(self.queues, 0)
        self.queries = 0  # is_done calls: a lane polling its events
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.clock = threading.Thread(target=self._tick, args=(period_s,), daemon=True)
        self.clock.start()

    def _tick(self, period_s):
        while not self.stop.wait(period_s):
            with self.lock:
                for queue in self.queues.values():
                    pending = [e for e in queue if not e.done]
                    # a stream's next event completes once the events it waited on have
                    if pending and all(d.done for d in pending[0].after):
                        pending[0].done = True

    def record(self, lane, *, timing=False, blocking=False):
        event = type("Event", (), {"done": False})()
        with self.lock:
            event.after, self.waits[lane] = self.waits[lane], []
            queue = self.queues[lane]
            queue.append(event)
            if len(queue) % 2 == 0:  # a task's end event: count the unfinished tasks
                self.most_queued[lane] = max(self.most_queued[lane],
                                             sum(not e.done for e in queue[1::2]))
        return event

    def is_done(self, event):
        self.queries += 1
        return event is None or event.done

    def block_on(self, event):
        while not (event is None or event.done):
            threading.Event().wait(1e-4)

    def synchronize(self):
        for queue in self.queues.values():
            for event in queue:
                self.block_on(event)
        self.stop.set()

    def on(self, lane):
        import contextlib
        return contextlib.nullcontext()

    def wait(self, lane, event):
        if event is not None:
            with self.lock:
                self.waits[lane].append(event)

    def bind_thread(self):
        pass

    def prime_blas_workspaces(self, lane):
        pass

    def event_time_s(self, event):
        return 0.0

    def host_now_s(self):
        return 0.0


@pytest.mark.parametrize("plan", [PLAN, WATCHED], ids=["poll", "watch"])
@pytest.mark.parametrize("run_ahead", [1, 2, 3])
def test_a_stream_lane_keeps_at_most_run_ahead_tasks_queued_on_the_gpu(run_ahead, plan):
    gpu = _QueuedGpu()
    PlanEngine(plan, gpu, lambda task: None, run_ahead=run_ahead).run()
    assert max(gpu.most_queued.values()) == run_ahead  # reached, never passed


@pytest.mark.parametrize("plan", [PLAN, WATCHED], ids=["poll", "watch"])
def test_bounded_lanes_whose_streams_wait_on_each_other_never_deadlock(plan):
    # the fake GPU completes a stream's event only after the events that stream waited on:
    # at the tightest bound every lane still gets through three steps
    gpu = _QueuedGpu(period_s=2e-4)
    outcome = run_in_thread(PlanEngine(plan, gpu, lambda task: None, run_ahead=1).run)
    assert "error" not in outcome and len(outcome["value"]) == plan.graph.number_of_nodes()


def test_watched_lanes_never_poll_and_host_tasks_start_once_their_gpu_inputs_are_done():
    """lane_waits "watch": no lane queries an event (each query takes the GIL); a host lane's
    task still starts only after the GPU work it takes is done, as the watcher reports it."""
    gpu = _QueuedGpu()
    early = []

    def run_task(task):
        if task.lane not in STREAM_LANES:
            early.extend(p for p in WATCHED.graph.predecessors(task.id)
                         if p in engine._end_event and not engine._end_event[p].done)

    engine = PlanEngine(WATCHED, gpu, run_task)
    outcome = run_in_thread(engine.run)
    assert "error" not in outcome
    assert any(WATCHED.task(p).lane in STREAM_LANES  # the case is exercised
               for t in WATCHED.lane_order["cpu"] for p in WATCHED.graph.predecessors(t))
    assert early == []
    assert gpu.queries == 0
    polled = _QueuedGpu()
    PlanEngine(PLAN, polled, lambda task: None).run()
    assert polled.queries > 0  # the poll mode, for contrast


# blocks updated on the GPU: a step's last GPU work (their optimizer steps) has no host task
# after it in the step, so the step is done on the host before its GPU work is
GPU_UPDATED = build_plan(make_tiny_model(3), TrainSpec(micro_batch=1, seq_len=16),
                         Policy.of(gpu_updated_blocks=5), num_steps=3)


@pytest.mark.parametrize("lane_waits", ["poll", "watch"])
def test_a_step_has_landed_once_every_gpu_task_of_it_is_done(lane_waits):
    """on_step_done comes once a step's tasks have run on the host, its GPU work maybe still
    queued; wait_step_landed (another thread's) returns once that work is done too."""
    plan = replace(GPU_UPDATED, policy=GPU_UPDATED.policy.with_(lane_waits=lane_waits))
    gpu, checks, results = _QueuedGpu(period_s=2e-3), [], []

    def gpu_work_of(step: int) -> list:
        return [engine._end_event[t] for t in plan.graph
                if plan.task(t).step == step and t in engine._end_event]

    def check(step: int, queued_when_done: bool) -> None:
        results.append((step, engine.wait_step_landed(step), queued_when_done,
                        all(e.done for e in gpu_work_of(step))))

    def on_step_done(step: int) -> None:
        queued = not all(e.done for e in gpu_work_of(step))
        checks.append(threading.Thread(target=check, args=(step, queued)))
        checks[-1].start()

    engine = PlanEngine(plan, gpu, lambda task: None, on_step_done=on_step_done)
    assert "error" not in run_in_thread(engine.run)
    for thread in checks:
        thread.join(10)
    assert sorted(step for step, *_ in results) == [0, 1, 2]
    assert all(landed and done for _, landed, _, done in results)
    assert any(queued for _, _, queued, _ in results)  # the wait had GPU work to wait for
    if lane_waits == "watch":
        assert gpu.queries == 0  # watched: the wait sleeps on the watchers' flags


def test_unbounded_the_stream_lanes_run_ahead_of_a_slow_gpu():
    gpu = _QueuedGpu()
    PlanEngine(PLAN, gpu, lambda task: None, run_ahead=0).run()
    assert max(gpu.most_queued.values()) > 3


def test_a_negative_run_ahead_is_refused():
    with pytest.raises(ValueError, match="run_ahead=-1"):
        PlanEngine(PLAN, LaneDevice("cpu"), lambda task: None, run_ahead=-1)


@pytest.mark.parametrize("value", ["lots", "-1"])
def test_the_run_ahead_setting_must_be_a_whole_number_of_tasks(monkeypatch, value):
    from layerslide.planner.settings import run_ahead_from_env

    monkeypatch.setenv("LAYERSLIDE_RUN_AHEAD", value)
    with pytest.raises(ValueError, match="LAYERSLIDE_RUN_AHEAD"):
        run_ahead_from_env(3)


def test_the_bound_comes_from_the_plans_policy_and_not_the_environment(monkeypatch):
    """The environment sets the policy at the command line (cli.options); the engine runs the
    plan's bound, which the plan file records."""
    from layerslide.planner.settings import run_ahead_from_env

    plan = build_plan(make_tiny_model(3), TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(stream_run_ahead=2), num_steps=2)
    monkeypatch.setenv("LAYERSLIDE_RUN_AHEAD", "0")
    assert PlanEngine(plan, LaneDevice("cpu"), lambda task: None).run_ahead == 2
    assert PlanEngine(PLAN, LaneDevice("cpu"), lambda task: None).run_ahead == 3  # default
    assert run_ahead_from_env(plan.policy.schedule.stream_run_ahead) == 0
    assert PlanEngine(plan, LaneDevice("cpu"), lambda task: None, run_ahead=1).run_ahead == 1


class _PrimingDevice(LaneDevice):
    """Records which thread primed the BLAS workspaces, and when."""

    def __init__(self, events):
        super().__init__("cpu")
        self.events = events

    def prime_blas_workspaces(self, lane):
        self.events.append(("prime", lane, threading.get_ident()))


@pytest.mark.parametrize("serial", [False, True])
def test_the_compute_lane_thread_primes_the_blas_workspaces_before_its_first_task(serial):
    events = []

    def run_task(task):
        events.append(("task", task.lane, threading.get_ident()))

    PlanEngine(PLAN, _PrimingDevice(events), run_task, serial=serial).run()
    primes = [e for e in events if e[0] == "prime"]
    assert [e[1] for e in primes] == ["gpu"]  # once per run, for the compute lane
    first_gpu = next(i for i, e in enumerate(events) if e[:2] == ("task", "gpu"))
    assert events.index(primes[0]) < first_gpu
    assert primes[0][2] == events[first_gpu][2]  # on the thread that runs the GEMMs


def test_the_lanes_run_under_the_interval_the_plan_records():
    from dataclasses import replace

    from layerslide.planner.settings import ExecutorKnobs

    plan = replace(PLAN, policy=replace(PLAN.policy,
                                        executor=ExecutorKnobs(lane_switch_interval_s=1e-3)))
    seen = set()
    PlanEngine(plan, LaneDevice("cpu"), lambda task: seen.add(sys.getswitchinterval())).run()
    assert len(seen) == 1 and seen.pop() == pytest.approx(1e-3)


@pytest.mark.parametrize("plan", [PLAN, WATCHED], ids=["poll", "watch"])
def test_a_stop_ends_the_run_after_the_step_in_flight_skipping_the_later_steps(plan):
    stop, ran = threading.Event(), []

    def run_task(task):
        ran.append(task)
        if task.step == 1 and task.lane == "gpu":
            stop.set()

    engine = PlanEngine(plan, LaneDevice("cpu"), run_task, stop=stop)
    outcome = run_in_thread(engine.run, timeout_s=30)
    assert "error" not in outcome
    assert engine.stopped_after == 1  # the last of the 3 steps never runs
    assert {t.step for t in ran} == {0, 1}


@pytest.mark.parametrize("plan", [PLAN, WATCHED], ids=["poll", "watch"])
def test_ctrl_c_landing_on_a_lane_raises_in_run_only_once_every_lane_has_stopped(plan):
    """A SIGINT that lands on a lane thread: the main thread, waiting for the lanes, still
    raises KeyboardInterrupt, and only after no task is left running (the caller then frees
    what the tasks use). The victim runs once every lane has started."""
    victim = plan.lane_order["gpu"][len(plan.lane_order["gpu"]) // 2]
    running, lock = [0], threading.Lock()

    def run_task(task):
        with lock:
            running[0] += 1
        try:
            if task.id == victim:
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
                time.sleep(0.3)  # still at work when the main thread hears of it
        finally:
            with lock:
                running[0] -= 1

    with pytest.raises(KeyboardInterrupt):
        PlanEngine(plan, LaneDevice("cpu"), run_task).run()
    assert running[0] == 0
