"""Plans built once and simulations run once, per process: a search meets the same plan again
(a candidate's settled clock and niced CPU kernels simulate its plan again; the bounds and the
sweep check the same static buffers), and so does the next tune in the process (a plan does
not depend on the profile: what-if's rows and the purchase search's variants share them)."""

from __future__ import annotations

import copy
import gc
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Plan, Policy, TrainSpec, build_plan
from layerslide.planner.build import static_buffers
from layerslide.planner.plan import MIN_STEPS, runtime_buffer_id
from layerslide.simulator import (
    CostModel,
    Overflow,
    Prediction,
    memory_limits,
    simulate,
    static_rejection,
)
from layerslide.simulator.predict import SimulationMemo
from layerslide.trace import TIERS
from layerslide.tuner.bounds import gpu_in_use_lower_bound

# plans kept per process: at least this many (each a few MiB, 14 MiB at 70B), and more while
# they hold at most MEMO_TASKS tasks (the memo keeps that many plans alive anyway): an 8B tune
# on h200-bench settles a candidate's clock ~100 plans after its fill, and rebuilt 61 of them
PLAN_CACHE_SIZE = 32
# the bounds' plans of a few layers, two steps (tuner.bounds), kept per process: they do not
# depend on the profile, so the next tune of a what-if or purchase search meets them again
SMALL_PLAN_CACHE_SIZE = 64
STATIC_CACHE_SIZE = 64  # static buffers kept per process: a candidate's placements
_PLANS: OrderedDict[tuple, Plan] = OrderedDict()
_SMALL_PLANS: OrderedDict[tuple, Plan] = OrderedDict()
_STATIC: OrderedDict[tuple, tuple] = OrderedDict()
# the simulations of those plans: settling a plan's clock starts with the one the sweep ran,
# and a plan met again further on (a fill making the plan of another window's) is not rerun;
# kept while their plans hold this many tasks (~2 KiB each; at 123B ~30 plans, most of them
# the plan cache's own): a 8B tune on h200-bench ran 490 simulations of 391 plans with 8 kept
MEMO_TASKS = 200_000
MEMO = SimulationMemo(size=1024, max_tasks=MEMO_TASKS)


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cycle collector off while plans are built or simulated. Both allocate objects
    by the hundred thousand, and every collection walks the objects made since the last, the
    plans kept here included: on a 32B tune that was half its CPU time. A simulation and a plan
    dropped from here leave no cycles, so refcounting frees them. freeze: what is alive at the
    end (this module's plans, mostly) is left out of later collections (gc.freeze), where
    walking it once more took 2-5 s at the end of a 70B tune."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        gc.enable()


# networkx caches these views of a graph in the graph: each a reference cycle through it
_GRAPH_VIEWS = ("nodes", "adj", "succ", "pred", "edges", "out_edges", "in_edges", "degree",
                "in_degree", "out_degree")


def _trim(cache: OrderedDict, size: int, max_tasks: int | None = None) -> None:
    """Drop the oldest entries past size (while the plans kept hold more than max_tasks
    tasks, where given); a plan dropped loses its graph's cached views, so that refcounting
    frees it whole (the cycle collector stays off through a tune)."""
    while len(cache) > size and (
            max_tasks is None or sum(len(plan.graph) for plan in cache.values()) > max_tasks):
        _, value = cache.popitem(last=False)
        if isinstance(value, Plan):
            for name in _GRAPH_VIEWS:
                vars(value.graph).pop(name, None)


def _build_key(model: ModelSpec, train: TrainSpec, policy: Policy) -> tuple:
    """What the build reads: every policy group but the executor knobs."""
    return (model, train, policy.residency, policy.schedule, policy.kernels)


def plan_of(model: ModelSpec, train: TrainSpec, policy: Policy, num_steps: int) -> Plan:
    """build_plan, remembered for the last few candidates: plans that differ only in executor
    knobs share one (each caller gets its own policy and meta)."""
    key = (*_build_key(model, train, policy), num_steps)
    plan = _PLANS.get(key)
    if plan is None:
        with collector_paused():
            plan = _PLANS[key] = build_plan(model, train, policy, num_steps=num_steps,
                                            validate=False)
        _trim(_PLANS, PLAN_CACHE_SIZE, MEMO_TASKS)
    else:
        _PLANS.move_to_end(key)
    out = copy.copy(plan)
    out.policy, out.meta = policy, dict(plan.meta)
    return out


def small_plan_of(model: ModelSpec, train: TrainSpec, policy: Policy) -> Plan:
    """build_plan of MIN_STEPS steps for a bound (a class plan, a short plan), remembered;
    read-only to its callers."""
    key = _build_key(model, train, policy)
    plan = _SMALL_PLANS.get(key)
    if plan is None:
        with collector_paused():
            plan = _SMALL_PLANS[key] = build_plan(model, train, policy, num_steps=MIN_STEPS,
                                                  validate=False)
        _trim(_SMALL_PLANS, SMALL_PLAN_CACHE_SIZE)
    return plan


def static_buffers_of(model: ModelSpec, train: TrainSpec, policy: Policy) -> tuple:
    """planner.build.static_buffers, remembered for the last candidates' placements."""
    key = _build_key(model, train, policy)
    buffers = _STATIC.get(key)
    if buffers is None:
        buffers = _STATIC[key] = static_buffers(model, train, policy)
        while len(_STATIC) > STATIC_CACHE_SIZE:
            _STATIC.popitem(last=False)
    return buffers


def simulated(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile, *,
              gpu_memory_bytes: int | None, num_steps: int, costs: CostModel | None = None,
              settle_clock: bool = True) -> Prediction:
    """simulate() of the candidate's plan, through the memo; without its trace (a search
    keeps none)."""
    plan = plan_of(model, train, policy, num_steps)
    return _simulated(plan, profile, gpu_memory_bytes, costs, settle_clock)


def _simulated(plan: Plan, profile: HardwareProfile, gpu_memory_bytes: int | None,
               costs: CostModel | None, settle_clock: bool) -> Prediction:
    with collector_paused():
        return simulate(plan, profile, gpu_memory_bytes=gpu_memory_bytes, costs=costs,
                        settle_clock=settle_clock, memo=MEMO, keep_trace=False)


def rejected_early(buffers: tuple, train: TrainSpec, profile: HardwareProfile,
                   gpu_memory_bytes: int | None) -> Prediction | None:
    """static_rejection of a candidate's static buffers: one rank's, every rank's tokens."""
    return static_rejection(buffers, train.global_tokens_per_step, profile,
                            gpu_memory_bytes=gpu_memory_bytes, ranks_per_host=train.gpus,
                            hosts=train.hosts)


def rejected_on_gpu(buffers: tuple, train: TrainSpec, profile: HardwareProfile,
                    gpu_memory_bytes: int | None, held_bytes: int) -> Prediction:
    """The Prediction of a candidate rejected before its simulation: a plan of it holds at
    least held_bytes on the GPU at once (tuner.bounds.gpu_in_use_lower_bound) over the limit;
    `buffers`: its static ones."""
    static = {tier: sum(b.bytes for b in buffers if b.tier == tier and b.is_static)
              for tier in TIERS}
    limits = memory_limits(profile, gpu_memory_bytes)
    runtime = sum(b.bytes for b in buffers if b.id == runtime_buffer_id("gpu"))
    return Prediction(
        label="", tokens_per_step=train.global_tokens_per_step, limits_bytes=limits,
        ranks_per_host=train.gpus, hosts=train.hosts,
        peak_bytes={**static, "gpu": held_bytes}, gpu_runtime_bytes=runtime,
        overflows=(Overflow(tier="gpu", need_bytes=held_bytes, limit_bytes=limits["gpu"]),))


def predicted(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile, *,
              gpu_memory_bytes: int | None, num_steps: int, costs: CostModel,
              settle_clock: bool) -> Prediction:
    """The candidate simulated; one whose static buffers overflow is rejected before its plan
    is built (a step-major plan of many micro-batches has hundreds of thousands of tasks), one
    whose plan holds more on the GPU at once than the GPU has before it is simulated (the
    checkpoints of every layer and micro-batch kept there: a third of a 123B tune's
    simulations overflowed so)."""
    buffers = static_buffers_of(model, train, policy)
    early = rejected_early(buffers, train, profile, gpu_memory_bytes)
    if early is not None:
        return early
    plan = plan_of(model, train, policy, num_steps)
    held = gpu_in_use_lower_bound(plan)
    if held > memory_limits(profile, gpu_memory_bytes)["gpu"]:
        return rejected_on_gpu(buffers, train, profile, gpu_memory_bytes, held)
    return _simulated(plan, profile, gpu_memory_bytes, costs, settle_clock)
