"""The untraced run of simulator.engine in C (csrc/engine.c, compiled on first use): the run a
search makes of each candidate, event for event the Python engine's, at a fraction of its cost
(benchmarks/sim_speed.py times the two). tests/simulator/test_native.py holds the two equal.

`simulate` returns None where the library is not there (no C compiler, or LAYERSLIDE_NATIVE=0)
or the plan is one it leaves to Python (see _PlanArrays.of); the caller then runs the Python
engine. A run the C engine stops on (a stall, memory gone negative) is rerun in Python too,
which raises the error with its message."""

from __future__ import annotations

import ctypes
import functools
import math
from array import array
from itertools import accumulate, chain, repeat
from operator import attrgetter, itemgetter
from pathlib import Path

from layerslide.native_build import build
from layerslide.planner.plan import Plan, runtime_buffer_id
from layerslide.simulator.costmodel import CostModel, shape_of
from layerslide.simulator.memory import STATIC_POOL
from layerslide.trace import TIERS, MemorySample, Trace

SOURCE = Path(__file__).parent / "csrc" / "engine.c"
# no contraction into fused multiply-adds: each product and sum rounds as Python's does
FLAGS = ("-O2", "-ffp-contract=off", "-shared", "-fPIC")
_P = ctypes.c_void_p
_INPUT_FIELDS = (
    "n_tasks:i n_lanes:i run_ahead:i lane_start:p lane_strict:p task_shape:p succ_off:p succ:p "
    "pred_off:p pred:p solo_s:p dispatch_s:p share:p dispatch_share:p tag:p use_off:p use_res:p "
    "duse_off:p duse_res:p use_demand:p duse_demand:p n_resources:i capacity:p "
    "mixed_capacity:p has_mixed:p n_tiers:i gpu_tier:i n_buffers:i buf_tier:p buf_alloc_task:p "
    "buf_bytes:p buf_at_end:p buf_outlives:p runtime_buffer:i rel_off:p rel_task:p")
_OUTPUT_FIELDS = ("start_s end_s span_start span_end ran static_in_use peak held_peak pool_peak "
                  "pool_reserved pool_peak_rank pool_reserved_rank")


def _struct(name: str, fields: str) -> type[ctypes.Structure]:
    """A ctypes mirror of a csrc/engine.c struct: `name:i` an int32_t, `name:p` a pointer."""
    kinds = {"i": ctypes.c_int32, "p": _P}
    return type(name, (ctypes.Structure,), {"_fields_": [
        (f.split(":")[0], kinds[f.split(":")[1]]) for f in fields.split()]})


_Input = _struct("_Input", _INPUT_FIELDS)
_Output = _struct("_Output", " ".join(f"{f}:p" for f in _OUTPUT_FIELDS.split()))


@functools.cache
def _library() -> ctypes.CDLL | None:
    path = build(SOURCE, FLAGS, "simulating in Python")
    if path is None:
        return None
    library = ctypes.CDLL(str(path))
    library.simulate_untraced.argtypes = [ctypes.POINTER(_Input), ctypes.POINTER(_Output)]
    library.simulate_untraced.restype = ctypes.c_int
    return library


def available() -> bool:
    """Whether the C engine is built and loaded."""
    return _library() is not None


def _csr(lists, number) -> tuple[array, array]:
    """Offsets and items (as their numbers) of a sequence of sequences, as int32 arrays."""
    lists = list(lists)
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, lists)))
    return offsets, array("i", map(number, chain.from_iterable(lists)))


def _pointer(values: array) -> int:
    return values.buffer_info()[0]


_TIER_NUMBER = {tier: i for i, tier in enumerate(TIERS)}
_BUFFER_FIELDS = attrgetter("id", "tier", "bytes", "alloc_task", "at_end", "outlives_outputs",
                            "release_tasks")


class _PlanArrays:
    """A plan's side of a run as flat arrays: its tasks numbered lane by lane in lane order,
    the edges in the graph's order, its buffers, and one task of each cost shape. Built with
    maps, not loops: a search marshals every plan it simulates."""

    def __init__(self, plan: Plan, tids: list[str], index: dict[str, int]):
        nodes, succ, pred = plan.graph._node, plan.graph._succ, plan.graph._pred
        self.lanes = list(plan.lane_order)
        self.tids = tids
        self.lane_start = array("i", [0])
        self.lane_start.extend(accumulate(map(len, plan.lane_order.values())))
        self.strict = array("b", (plan.lane_discipline[lane] == "strict" for lane in self.lanes))
        tasks = list(map(itemgetter("task"), map(nodes.__getitem__, tids)))
        # a worker's tasks are found by their own lane: each must be the one it is listed in
        self.lanes_agree = list(map(attrgetter("lane"), tasks)) == list(chain.from_iterable(
            repeat(lane, len(order)) for lane, order in plan.lane_order.items()))
        shapes = list(map(shape_of, tasks))
        # a task of each shape (the last, in the order shapes first appear): a cost depends on
        # the shape alone (CostModel.cost)
        examples = dict(zip(shapes, tasks))
        self.examples = list(examples.values())
        self.task_shape = array("i", map({s: i for i, s in enumerate(examples)}.__getitem__,
                                         shapes))
        number = index.__getitem__
        self.succ_off, self.succ = _csr(map(succ.__getitem__, tids), number)
        self.pred_off, self.pred = _csr(map(pred.__getitem__, tids), number)
        self.markers = list(map(number, plan.meta.get("step_markers", ())))
        # one at least as long as the tasks never binds, as 0: clamped to fit an int32
        self.run_ahead = min(plan.stream_run_ahead, len(tids))
        ids, tiers, nbytes, allocs, at_end, outlives, releases = zip(
            *map(_BUFFER_FIELDS, plan.buffers)) or ((),) * 7
        self.buffer_ids = ids
        self.buf_tier = array("i", map(_TIER_NUMBER.__getitem__, tiers))
        self.buf_bytes = array("q", nbytes)  # a TypeError unless whole numbers
        self.rel_off, self.rel_task = _csr(releases, number)
        # -1: held before the plan runs
        self.buf_alloc = array("i", map({**index, None: -1}.__getitem__, allocs))
        self.buf_at_end, self.buf_outlives = array("b", at_end), array("b", outlives)
        runtime = runtime_buffer_id("gpu")
        self.runtime_buffer = ids.index(runtime) if runtime in ids else -1

    @classmethod
    def of(cls, plan: Plan) -> _PlanArrays | None:
        """The plan's arrays, or None for a plan the Python engine raises on or reads
        otherwise: a task in no lane, in two or in another than its own, a lane discipline
        other than strict and priority, a lane named as the static pool, buffers sharing an
        id, naming a task of no lane or of bytes not a whole number >= 0 (or, together, past
        int64), a tier the ledger does not count."""
        tids = list(chain.from_iterable(plan.lane_order.values()))
        index = dict(zip(tids, range(len(tids))))
        if (len(index) != len(tids) or len(tids) != len(plan.graph._node)
                or not set(plan.lane_discipline.values()) <= {"strict", "priority"}
                or STATIC_POOL in plan.lane_order):
            return None
        try:
            arrays = cls(plan, tids, index)
        except (TypeError, KeyError, OverflowError):
            return None
        nbytes = arrays.buf_bytes
        if (not arrays.lanes_agree or len(set(arrays.buffer_ids)) != len(arrays.buffer_ids)
                or (nbytes and (min(nbytes) < 0 or sum(nbytes) >= 2**62))):
            return None
        return arrays


class _CostArrays:
    """The cost model's side: each shape's cost, the resources' capacities, the tags (0: "",
    a dispatch's)."""

    def __init__(self, arrays: _PlanArrays, costs: CostModel):
        capacities, mixed = costs.capacities(), costs.mixed_capacities()
        self.resources = {name: i for i, name in enumerate(capacities)}
        self.capacity = array("d", capacities.values())
        self.mixed = array("d", (mixed.get(name, 0.0) for name in capacities))
        self.has_mixed = array("b", (name in mixed for name in capacities))
        tags = {"": 0}
        shape_costs = [costs.cost(task) for task in arrays.examples]
        # what Python would raise on (a resource without a capacity, a weight of 0) or read
        # otherwise (a number not finite)
        numbers = [*capacities.values(), *mixed.values(),
                   *(x for c in shape_costs for x in (c.solo_s, c.dispatch_s, c.share,
                                                      c.dispatch_share))]
        self.ok = all(map(math.isfinite, numbers)) and all(
            c.share > 0 and c.dispatch_share > 0
            and all(r in self.resources and math.isfinite(d) for r, d in c.uses + c.dispatch_uses)
            for c in shape_costs)
        self.solo = array("d", (c.solo_s for c in shape_costs))
        self.dispatch = array("d", (c.dispatch_s for c in shape_costs))
        self.share = array("d", (c.share for c in shape_costs))
        self.dispatch_share = array("d", (c.dispatch_share for c in shape_costs))
        self.tag = array("i", (tags.setdefault(c.tag, len(tags)) for c in shape_costs))
        def number(use: tuple[str, float]) -> int:  # an unknown resource: not ok, above
            return self.resources.get(use[0], 0)

        self.use_off, self.use_res = _csr((c.uses for c in shape_costs), number)
        self.use_demand = array("d", (d for c in shape_costs for _, d in c.uses))
        self.duse_off, self.duse_res = _csr((c.dispatch_uses for c in shape_costs), number)
        self.duse_demand = array("d", (d for c in shape_costs for _, d in c.dispatch_uses))


def _input(plan: _PlanArrays, cost: _CostArrays) -> _Input:
    p = _pointer
    return _Input(
        n_tasks=len(plan.tids), run_ahead=plan.run_ahead, n_lanes=len(plan.lanes),
        lane_start=p(plan.lane_start), lane_strict=p(plan.strict),
        task_shape=p(plan.task_shape), succ_off=p(plan.succ_off), succ=p(plan.succ),
        pred_off=p(plan.pred_off), pred=p(plan.pred), solo_s=p(cost.solo),
        dispatch_s=p(cost.dispatch), share=p(cost.share), dispatch_share=p(cost.dispatch_share),
        tag=p(cost.tag), use_off=p(cost.use_off), use_res=p(cost.use_res),
        duse_off=p(cost.duse_off), duse_res=p(cost.duse_res), use_demand=p(cost.use_demand),
        duse_demand=p(cost.duse_demand), n_resources=len(cost.capacity),
        capacity=p(cost.capacity), mixed_capacity=p(cost.mixed), has_mixed=p(cost.has_mixed), n_tiers=len(TIERS),
        gpu_tier=TIERS.index("gpu"), n_buffers=len(plan.buf_tier), buf_tier=p(plan.buf_tier),
        buf_alloc_task=p(plan.buf_alloc), buf_bytes=p(plan.buf_bytes),
        buf_at_end=p(plan.buf_at_end), buf_outlives=p(plan.buf_outlives),
        runtime_buffer=plan.runtime_buffer, rel_off=p(plan.rel_off), rel_task=p(plan.rel_task))


class _Results:
    """The arrays the C run fills."""

    def __init__(self, tasks: int, lanes: int):
        per_task, pools = array("d", [0.0]) * max(tasks, 1), lanes + 1
        self.start_s, self.end_s = array("d", per_task), array("d", per_task)
        self.span_start, self.span_end = array("d", per_task), array("d", per_task)
        self.ran = array("i", [0]) * max(tasks, 1)
        self.static_in_use, self.peak = array("q", [0]) * len(TIERS), array("q", [0]) * len(TIERS)
        self.held_peak = array("q", [0])
        self.pool_peak, self.pool_reserved = array("q", [0]) * pools, array("q", [0]) * pools
        self.pool_peak_rank = array("i", [0]) * pools
        self.pool_reserved_rank = array("i", [0]) * pools

    def output(self) -> _Output:
        return _Output(**{name: _pointer(getattr(self, name))
                          for name in _OUTPUT_FIELDS.split()})


def simulate(plan: Plan, costs: CostModel) -> tuple[Trace, list[float], dict] | None:
    """engine.simulate_run's run without events or memory samples: its trace, the step
    markers' ends and each lane's runs (_lane_runs); None where the C engine cannot run it."""
    library = _library()
    if library is None:
        return None
    arrays = _PlanArrays.of(plan)
    if arrays is None:
        return None
    cost = _CostArrays(arrays, costs)
    if not cost.ok:
        return None
    results = _Results(len(arrays.tids), len(arrays.lanes))
    if library.simulate_untraced(ctypes.byref(_input(arrays, cost)),
                                 ctypes.byref(results.output())):
        return None
    return _trace(arrays, results), [results.end_s[i] for i in arrays.markers], \
        _lane_runs(arrays, results)


def _ranked(names: list[str], values: array, ranks: array) -> dict[str, int]:
    """The pools a run used, in the order it first used them (the ledger's dicts' order)."""
    used = sorted((rank, i) for i, rank in enumerate(ranks) if rank >= 0)
    return {names[i]: values[i] for _, i in used}


def _trace(arrays: _PlanArrays, results: _Results) -> Trace:
    pools = [STATIC_POOL, *arrays.lanes]
    meta = {"peak_bytes": dict(zip(TIERS, results.peak)),
            "gpu_held_peak_bytes": results.held_peak[0],
            "gpu_pool_peak_bytes": _ranked(pools, results.pool_peak, results.pool_peak_rank),
            "gpu_pool_reserved_bytes": _ranked(pools, results.pool_reserved,
                                               results.pool_reserved_rank)}
    memory = tuple(MemorySample(time_s=0.0, tier=tier, bytes_in_use=used)
                   for tier, used in zip(TIERS, results.static_in_use))
    return Trace(source="simulated", label="", events=(), memory=memory, meta=meta)


def _lane_runs(arrays: _PlanArrays, results: _Results) -> dict[str, tuple[list, list[int]]]:
    """Each lane that ran tasks: its (start_s, end_s) in the order it ran them, and those
    tasks' numbers (engine.in_trace_order orders the lanes by them)."""
    starts, ends = results.span_start.tolist(), results.span_end.tolist()
    return {lane: (list(zip(starts[lo:hi], ends[lo:hi])), results.ran[lo:hi].tolist())
            for lane, lo, hi in zip(arrays.lanes, arrays.lane_start, arrays.lane_start[1:])
            if lo < hi}
