"""tune: search training settings and policies with the simulator under memory limits.

For each candidate (window, micro-batch, accumulation, activation placement, cast, optimizer
order) the optimizer-state placement is the least NVMe use that fits the host: NVMe only ever
slows a step down, so a candidate gets RAM first; while the host overflows it first bounds the
pinned gradient landing buffers, then spills moments, then master weights, then (from the
host) the activation checkpoints to NVMe.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import os
import signal
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace

from layerslide.hwprofiles import HardwareProfile
from layerslide.kinds import COMPUTE_KINDS
from layerslide.planner import ModelSpec, Plan, Policy, TrainSpec, build_plan, sizes
from layerslide.planner.build import (
    build_repeatable_plan,
    gpu_layout,
    static_buffers,
)
from layerslide.planner.plan import STEADY_STEPS, runtime_buffer_id
from layerslide.planner.settings import (
    ACCUMULATIONS,
    ACTIVATION_PLACEMENTS,
    BOUNDED_LANDING_BUFFERS,
    CAST_MODES,
    GPU_UPDATE_ORDERS,
    MOMENT_PRECISIONS,
    OPTIMIZER_ORDERS,
    grads_land_in_upload,
)
from layerslide.simulator import (
    CostModel,
    Overflow,
    Prediction,
    memory_limits,
    simulate,
    static_rejection,
)
from layerslide.simulator.predict import SimulationMemo, floors_by_block
from layerslide.trace import TIERS
from layerslide.tuner.bounds import (
    GPU_FILL_MARGIN,
    SHORT_PLAN_GPU_MARGIN,
    BlockFloors,
    class_bounds,
    class_floors,
    class_key,
    fill_takes,
    gpu_in_use_lower_bound,
    gpu_update_blocks_fitting,
    keeps_blocks_on_gpu,
    max_gpu_speedup,
    plan_bounds,
    short_plan,
    tokens_per_s_bound,
)
from layerslide.tuner.lanes_first import lanes_first, niced_where_gpu_bound, priced_apart

# (moments_on_nvme, master_on_nvme), least NVMe first (then WEIGHT_SPILLS).
NVME_PLACEMENTS = ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (1.0, 0.5), (1.0, 1.0))
# Candidates simulated again with the GPU's clock settled against its busy fraction (profiles
# with GPUSpec.busy_speedup) before the final ranking; the search itself holds the clock at the
# efficiency tables' rate, which takes one simulation per try instead of two or three.
CLOCK_FINALISTS = 16
# The fastest candidates of the sweep that then try filling the GPU memory they leave free with
# blocks updated on the GPU (each try a simulation): a fill speeds a candidate up when the CPU
# bounds it, rarely enough to overtake one this far down.
FILL_FINALISTS = 16
# The default cap on tokens per step (micro-batch x sequence x accumulation): 256 sequences of
# 1k, within the global batches fine-tuning recipes use (64-512 sequences); above it a small
# fine-tuning set gets too few optimizer steps, however much faster each token is.
MAX_TOKENS_PER_STEP = 256 * 1024
# Step-major accumulation is tried up to this many micro-batches: beyond, each micro-batch
# reloads every weight and offloads every grad (results/archive/layer_major_2026-12-01: 2.5x slower
# than layer-major at 3B x16), and its plan holds a copy of the GPU sequence per micro-batch,
# slow to simulate.
STEP_MAJOR_MAX_ACCUM = 4


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The settings tune tries; every combination is one candidate."""

    windows: tuple[int, ...] = (1, 2, 4, 8)
    micro_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    grad_accums: tuple[int, ...] = (1, 4, 16, 64)
    # how a step of several micro-batches runs (Policy.schedule.accumulation): both by default,
    # step-major only up to step_major_max_accum where layer-major is tried too
    accumulations: tuple[str, ...] = ACCUMULATIONS
    step_major_max_accum: int = STEP_MAJOR_MAX_ACCUM
    max_tokens_per_step: int | None = MAX_TOKENS_PER_STEP  # None: no cap
    activations: tuple[str, ...] = ("gpu", "host")
    casts: tuple[str, ...] = ("cpu_once", "gpu")
    # Casts on a worker beside the optimizer's: not tried by default. The cost model, sharing
    # host memory and the cores between them, predicts them even with taking turns, where the
    # H200 machine ran them 11% slower at once (benchmarks/results/sim_vs_reference.md).
    cast_workers: tuple[bool, ...] = (False,)
    optimizer_orders: tuple[str, ...] = ("deadline",)
    # how AdamW's moments are stored: fp32 only unless asked, since the others change the
    # numerics (Residency.moment_precision)
    moment_precisions: tuple[str, ...] = ("fp32",)
    allow_nvme: bool = True  # spill optimizer state to NVMe when the host is too small
    # Fill the GPU memory a feasible candidate leaves free with blocks updated on the GPU
    # (their state off the host and off the CPU), and keep that when it is faster.
    fill_gpu_updates: bool = True
    # Run the GPU-bound leaders' CPU kernels niced, as train does (tuner.lanes_first); False
    # where the niceness is chosen (the base policy's stands)
    lanes_first: bool = True

    def __post_init__(self) -> None:
        for name in ("windows", "micro_batches", "grad_accums", "accumulations", "activations",
                     "casts", "cast_workers", "optimizer_orders", "moment_precisions"):
            if not getattr(self, name):
                raise ValueError(f"SearchSpace.{name} is empty: give at least one value")
        if not isinstance(self.step_major_max_accum, int) or self.step_major_max_accum < 1:
            raise ValueError(f"SearchSpace.step_major_max_accum={self.step_major_max_accum!r}: "
                             "give a positive number of micro-batches")
        for name in ("windows", "micro_batches", "grad_accums"):
            bad = [v for v in getattr(self, name) if not isinstance(v, int) or v < 1]
            if bad:
                raise ValueError(f"SearchSpace.{name}: {bad} are not positive integers")
        if self.max_tokens_per_step is not None and (
                not isinstance(self.max_tokens_per_step, int) or self.max_tokens_per_step < 1):
            raise ValueError(f"SearchSpace.max_tokens_per_step={self.max_tokens_per_step!r}: "
                             "give a positive number of tokens, or None for no cap")
        for name, allowed in (("activations", ACTIVATION_PLACEMENTS), ("casts", CAST_MODES),
                              ("optimizer_orders", OPTIMIZER_ORDERS),
                              ("accumulations", ACCUMULATIONS),
                              ("moment_precisions", MOMENT_PRECISIONS)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"SearchSpace.{name}: {bad} unknown; choose from "
                                 f"{', '.join(allowed)}")

    def candidates(self, seq_len: int, max_grad_norm: float | None,
                   base: Policy) -> Iterable[tuple[TrainSpec, Policy]]:
        for w, mb, ga, accumulation, act, cast, worker, order, moments in itertools.product(
                self.windows, self.micro_batches, self.grad_accums, self.accumulations,
                self.activations, self.casts, self.cast_workers, self.optimizer_orders,
                self.moment_precisions):
            if ga == 1 and accumulation != self.accumulations[0]:
                continue  # one micro-batch a step: both schedules are the same plan
            if (accumulation == "step_major" and ga > self.step_major_max_accum
                    and "layer_major" in self.accumulations):
                continue  # layer-major is tried instead
            tokens = mb * seq_len * ga
            if self.max_tokens_per_step is not None and tokens > self.max_tokens_per_step:
                continue
            train = TrainSpec(micro_batch=mb, seq_len=seq_len, grad_accum=ga,
                              max_grad_norm=max_grad_norm)
            policy = base.with_(window=w, prefetch_depth=min(base.schedule.prefetch_depth, w),
                                activations=act, cast=cast, accumulation=accumulation,
                                cast_worker=worker, optimizer_order=order,
                                moment_precision=moments)
            if not policy.cpu_casts:  # no CPU cast tasks for a worker to run
                if worker != self.cast_workers[0]:
                    continue  # the same plan as the candidate without it
                policy = policy.with_(cast_worker=False)
            yield train, policy


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One evaluated configuration: its settings and its prediction (trace dropped)."""

    train: TrainSpec
    policy: Policy
    prediction: Prediction

    @property
    def feasible(self) -> bool:
        return self.prediction.feasible

    def row(self) -> dict:
        p, t, s = self.policy.flat(), self.train, self.prediction
        return {
            "window": p["window"], "micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
            "tokens_per_step": t.tokens_per_step,
            **{k: p[k] for k in ("accumulation", "activations", "cast", "cast_worker",
                                 "optimizer_order", "moments_on_nvme", "master_on_nvme",
                                 "weights_on_nvme", "host_grad_buffers", "gpu_updated_blocks",
                                 "gpu_updated_order", "moment_precision", "cpu_nice")},
            "feasible": s.feasible, "reason": s.reason, "step_s": s.step_s,
            "tokens_per_s": s.tokens_per_s, "mfu": s.mfu, "bottleneck": s.bottleneck,
            "floor_s": s.floor_s,
            **{f"peak_{tier}_bytes": s.peak_bytes.get(tier, 0) for tier in TIERS},
            "gpu_need_bytes": s.gpu_need_bytes,  # what the GPU cap is checked against
        }


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """All candidates, best first; the best feasible one (if any) with its plan."""

    candidates: tuple[Candidate, ...]
    best_plan: Plan | None
    # candidates not simulated: the same settings at a smaller micro-batch overflowed the GPU
    pruned: int = 0
    # candidates not simulated: their bound could not beat the best (the best-first search)
    bounded: int = 0
    interrupted: bool = False  # Ctrl-C: the best found so far
    searched: int = 0  # candidates in the space

    @property
    def feasible(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.feasible)

    @property
    def best(self) -> Candidate | None:
        return self.feasible[0] if self.feasible else None

    def rejections(self) -> dict[str, int]:
        """How many candidates each tier rejected (a candidate may count for several)."""
        counts: dict[str, int] = {}
        for c in self.candidates:
            for o in c.prediction.overflows:
                counts[o.tier] = counts.get(o.tier, 0) + 1
        return counts


def evaluate(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile, *,
             gpu_memory_bytes: int | None, allow_nvme: bool, num_steps: int,
             fill_gpu_updates: bool = False, settle_clock: bool = True,
             costs: CostModel | None = None) -> Candidate:
    """Simulate one candidate with the least NVMe use that fits, then (if asked) with GPU
    memory it leaves free given to blocks updated on the GPU; if nothing fits, the last try
    (or the first that overflows a tier that more NVMe cannot relieve). settle_clock=False
    holds the GPU at its efficiency tables' rate (simulate's busy speedup left out). `costs`:
    a cost model of the profile to reuse (its costs per task shape), at the policy's knobs."""
    if costs is None or costs.lanes_first != policy.executor.lanes_first or costs.gpu_speedup != 1:
        costs = CostModel(profile, lanes_first=policy.executor.lanes_first)
    base = _place_state(model, train, policy, profile, gpu_memory_bytes=gpu_memory_bytes,
                        allow_nvme=allow_nvme, num_steps=num_steps, costs=costs,
                        settle_clock=settle_clock)
    if not (fill_gpu_updates and base.feasible):
        return base
    return filled_with_gpu_updates(model, base, profile, gpu_memory_bytes=gpu_memory_bytes,
                                   num_steps=num_steps, costs=costs, settle_clock=settle_clock)


def filled_with_gpu_updates(model: ModelSpec, base: Candidate, profile: HardwareProfile, *,
                            gpu_memory_bytes: int | None, num_steps: int,
                            costs: CostModel | None = None,
                            settle_clock: bool = True) -> Candidate:
    """The feasible candidate with the GPU memory it leaves free given to blocks updated on
    the GPU, where that is faster; else itself."""
    costs = costs or CostModel(profile, lanes_first=base.policy.executor.lanes_first)
    train = base.train
    pred = base.prediction
    headroom = (pred.limits_bytes["gpu"] - pred.gpu_need_bytes) * GPU_FILL_MARGIN
    best = base
    tried: set[tuple[int, ...]] = set()
    # the next forward's order first; with the layers first, a large embedding that does not
    # fit leaves room for layers that do
    for order in GPU_UPDATE_ORDERS:
        count = gpu_update_blocks_fitting(model, headroom, order,
                                           base.policy.residency.moment_precision)
        while count > base.policy.residency.gpu_updated_blocks:
            filled = base.policy.with_(gpu_updated_blocks=count, gpu_updated_order=order)
            blocks = gpu_layout(model.num_layers, filled).gpu_updated
            if blocks in tried:  # the same blocks taken in the other order
                break
            tried.add(blocks)
            prediction = _predicted(model, train, filled, profile, gpu_memory_bytes=gpu_memory_bytes,
                                    num_steps=num_steps, costs=costs, settle_clock=settle_clock)
            if prediction.feasible:
                if prediction.tokens_per_s > best.prediction.tokens_per_s:
                    best = Candidate(train=train, policy=filled,
                                     prediction=replace(prediction, trace=None))
                break
            count //= 2  # the estimate missed dynamic memory: try half as many
    return best


def _placement_steps(train: TrainSpec, policy: Policy, allow_nvme: bool,
                     ) -> tuple[list[tuple], list[int | None]]:
    """_place_state's coarse tries, least NVMe first: (moments, master, weights on NVMe,
    nvme_prefetch, activations), and the grad landing pools to try at each."""
    # casts other than cpu_once read master weights from RAM at every load; only the native
    # AdamW writing the bf16 copy itself can write the part of it that is on NVMe
    master_ok = policy.schedule.cast == "cpu_once"
    weights_ok = policy.optimizer_casts
    placements = [(moments, master, 0.0) for moments, master in
                  (NVME_PLACEMENTS if allow_nvme else NVME_PLACEMENTS[:1])
                  if master == 0 or master_ok]
    # (moments, master, weights, nvme_prefetch, activations): each read ahead stages a whole
    # block's fp32 state in RAM (Mistral-Large-123B: 15.5 GiB a layer), which can be all that
    # is left over; then the checkpoints go to NVMe (a layer-major step's are A micro-batches'
    # worth); last the bf16 weights, read at every load
    acts = policy.residency.activations
    steps = [(*placement, policy.schedule.nvme_prefetch, acts) for placement in placements]
    if allow_nvme and policy.schedule.nvme_prefetch > 1:
        steps.append((*placements[-1], 1, acts))
    if allow_nvme and acts == "host":
        steps += [(*step[:4], "nvme") for step in steps if step[:3] == placements[-1]]
    if allow_nvme and weights_ok:
        steps += [(*steps[-1][:2], weights, *steps[-1][3:]) for weights in WEIGHT_SPILLS]
    pools = [policy.residency.host_grad_buffers]
    if (train.max_grad_norm is None and policy.residency.host_grad_buffers is None
            and not grads_land_in_upload(policy, train)):
        # clipping holds every grad (no pool to bound); grads landing in the upload copies
        # have no landing buffers to bound
        pools.append(BOUNDED_LANDING_BUFFERS)
    return steps, pools


def _placed(policy: Policy, moments: float, master: float, weights: float, pool,
            prefetch: int, activations: str) -> Policy:
    return policy.with_(moments_on_nvme=moments, master_on_nvme=master, weights_on_nvme=weights,
                        host_grad_buffers=pool, nvme_prefetch=prefetch, activations=activations)


def _place_state(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile,
                 *, gpu_memory_bytes: int | None, allow_nvme: bool, num_steps: int,
                 costs: CostModel, settle_clock: bool) -> Candidate:
    """The least NVMe use (and pinned grad buffers) under which the candidate fits the host;
    with all state on NVMe and the host still over, one block's state staged at a time, then
    the checkpoints, then the bf16 weights on NVMe."""
    steps, pools = _placement_steps(train, policy, allow_nvme)
    master_ok, weights_ok = policy.schedule.cast == "cpu_once", policy.optimizer_casts
    coarse = {step[:3] for step in steps}

    def attempt(moments: float, master: float, weights: float, pool, prefetch: int,
                activations: str) -> Candidate:
        tried = _placed(policy, moments, master, weights, pool, prefetch, activations)
        prediction = _predicted(model, train, tried, profile, gpu_memory_bytes=gpu_memory_bytes,
                                num_steps=num_steps, costs=costs, settle_clock=settle_clock)
        return Candidate(train=train, policy=tried, prediction=replace(prediction, trace=None))

    def finer_between(placed: tuple, prefetch: int, activations: str,
                      over: Candidate) -> Candidate | None:
        """The least spill past `placed` (where the host overflowed by `over`'s bytes) that
        fits, short of the next coarse placement; the staging buffers a spill adds take some
        of it back: again while it falls short."""
        finer, candidate = tuple(placed), over
        while True:
            finer = _finer_spill(finer, _host_over_bytes(candidate), model.total_params,
                                 master_ok=master_ok, weights_ok=weights_ok,
                                 moment_precision=policy.residency.moment_precision)
            if finer is None or finer in coarse:
                return None
            candidate = attempt(*finer, pools[-1], prefetch, activations)
            overflowing = {o.tier for o in candidate.prediction.overflows}
            if overflowing != {"host"}:
                return None if overflowing else candidate

    candidate, host_over = None, None
    for *placed, prefetch, activations in steps:
        for pool in pools:
            candidate = attempt(*placed, pool, prefetch, activations)
            overflowing = {o.tier for o in candidate.prediction.overflows}
            if not overflowing:
                return candidate
            if overflowing != {"host"}:
                break
            # host overflow: a bounded pool of landing buffers shrinks the static bytes too
        else:
            host_over = (tuple(placed), prefetch, activations, candidate)
            continue
        # a GPU overflow that spilling cannot relieve, or an NVMe one: this placement spills
        # too much, the last one too little; between them (only then: each try is a
        # simulation) the least spill that fits
        if "gpu" not in overflowing and host_over is not None:
            return finer_between(*host_over) or candidate
        return candidate
    assert candidate is not None
    return candidate


SPILL_STEP = 0.05  # finer placements are rounded up to this fraction
WEIGHT_SPILLS = (0.5, 1.0)  # coarse fractions of the bf16 weights on NVMe, after all else


def _host_over_bytes(candidate: Candidate) -> int:
    return max((o.need_bytes - o.limit_bytes for o in candidate.prediction.overflows
                if o.tier == "host"), default=0)


def _finer_spill(placed: tuple[float, float, float], over_bytes: int, params: int, *,
                 master_ok: bool = True,
                 weights_ok: bool = True,
                 moment_precision: str = "fp32") -> tuple[float, float, float] | None:
    """(moments, master, weights) on NVMe that moves over_bytes more off the host: moments
    first, then master weights, then the bf16 weights (those the policy allows), rounded up to
    SPILL_STEP; None once all it may move is there."""
    allowed = (True, master_ok, weights_ok)
    which = next((i for i in range(3) if allowed[i] and placed[i] < 1.0), None)
    if which is None:
        return None
    share = placed[which]
    # bytes per parameter each share frees from the host, in the order they are spilled
    rates = (sizes.moment_bytes_per_param(moment_precision), sizes.MASTER_BYTES_PER_PARAM,
             sizes.UPLOAD_BYTES_PER_PARAM)
    step = -(-(share + over_bytes / (rates[which] * params)) // SPILL_STEP) * SPILL_STEP
    more = list(placed)
    more[which] = round(min(1.0, max(step, share + SPILL_STEP)), 4)
    return tuple(more)


def _predicted(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile, *,
               gpu_memory_bytes: int | None, num_steps: int, costs: CostModel,
               settle_clock: bool) -> Prediction:
    """The candidate simulated; one whose static buffers overflow is rejected before its plan
    is built (a step-major plan of many micro-batches has hundreds of thousands of tasks)."""
    early = static_rejection(_static_buffers(model, train, policy), train.tokens_per_step,
                             profile, gpu_memory_bytes=gpu_memory_bytes)
    if early is not None:
        return early
    plan = _plan(model, train, policy, num_steps)
    return simulate(plan, profile, gpu_memory_bytes=gpu_memory_bytes, costs=costs,
                    settle_clock=settle_clock, memo=_MEMO)


def _ranked(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (not c.feasible, -(c.prediction.tokens_per_s or 0.0)))


def _settled(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
             gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate's own placement simulated again with the GPU's clock settled."""
    plan = _plan(model, candidate.train, candidate.policy, num_steps)
    prediction = simulate(plan, profile, gpu_memory_bytes=gpu_memory_bytes, memo=_MEMO)
    return replace(candidate, prediction=replace(prediction, trace=None))


def _lanes_first(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
                 gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate with its CPU kernels niced where it is GPU-bound (tuner.lanes_first)."""
    found = niced_where_gpu_bound(
        candidate.policy, candidate.prediction, profile,
        lambda policy: simulate(_plan(model, candidate.train, policy, num_steps),
                                profile, gpu_memory_bytes=gpu_memory_bytes, memo=_MEMO))
    if found is None:
        return candidate
    policy, prediction = found
    return replace(candidate, policy=policy, prediction=replace(prediction, trace=None))


def _evaluate_args(args: tuple) -> Candidate:
    return evaluate(*args[:4], **args[4])


def _fill_args(args: tuple) -> Candidate:
    return filled_with_gpu_updates(*args[:3], **args[3])


def tune(model: ModelSpec, profile: HardwareProfile, *, seq_len: int = 1024,
         max_grad_norm: float | None = None, space: SearchSpace | None = None,
         base_policy: Policy | None = None, gpu_memory_bytes: int | None = None,
         num_steps: int = STEADY_STEPS, workers: int | None = None,
         progress: Callable[[int, int], None] | None = None, exhaustive: bool = False,
         tolerance: float = 0.0, interruptible: bool = True) -> TuneResult:
    """The best candidate of the space and its plan; candidates best tokens/s first,
    infeasible ones last.

    By default best-first (see _BestFirst): each candidate's tokens/s is bounded without
    simulating it (tuner.bounds), and only those whose bound beats the best found so far are
    simulated, best bound first, each then given the GPU-update fill, the settled clock and
    the niceness the sweep gives its leaders; `tolerance` (a fraction) also drops those that
    could beat it by no more than that. exhaustive=True simulates every candidate of the space
    and gives the 16 fastest the later stages (the search as it was, for comparison). Ctrl-C
    (KeyboardInterrupt) during the best-first search returns the best found so far
    (TuneResult.interrupted); interruptible=False lets it through (a sweep of many tunes).
    """
    space = space or SearchSpace()
    base = base_policy or Policy.of()
    if seq_len > model.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds {model.name}'s "
                         f"max_position_embeddings={model.max_position_embeddings}")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance!r}: give a fraction in [0, 1)")
    settings = list(space.candidates(seq_len, max_grad_norm, base))
    if not settings:
        raise ValueError(f"no candidate has at most max_tokens_per_step="
                         f"{space.max_tokens_per_step} tokens per step at seq_len={seq_len}: "
                         "raise the cap (--max-tokens-per-step) or try smaller micro-batches")
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    context = _Context(model=model, profile=profile, space=space,
                       gpu_memory_bytes=gpu_memory_bytes, num_steps=num_steps)
    if exhaustive:
        ranked, pruned, bounded, interrupted = (*_exhaustive(context, settings, workers,
                                                             progress), 0, False)
    else:
        search = _BestFirst(context, settings, workers, progress, tolerance, interruptible)
        ranked, pruned, bounded, interrupted = search.run()
    best_plan = None
    if ranked and ranked[0].feasible:
        best = ranked[0]
        best_plan = _plan(model, best.train, best.policy, num_steps)
        if best_plan.reach_steps() >= best_plan.num_steps:  # so that train can repeat it
            best_plan = build_repeatable_plan(model, best.train, best.policy)
        best_plan.meta.update({
            "tuned_for_profile": profile.name,
            "tuned_for_nvme_drives": profile.storage.drives,
            "gpu_memory_bytes": gpu_memory_bytes,
            "prediction": best.prediction.summary(),
        })
    return TuneResult(candidates=tuple(ranked), best_plan=best_plan, pruned=pruned,
                      bounded=bounded, interrupted=interrupted, searched=len(settings))


@dataclass(frozen=True, kw_only=True)
class _Context:
    """What every candidate of one tune shares (set once in each worker process)."""

    model: ModelSpec
    profile: HardwareProfile
    space: SearchSpace
    gpu_memory_bytes: int | None
    num_steps: int

    @property
    def settle_late(self) -> bool:
        """The profile has a busy speedup: the sweep holds the clock, the leaders settle it."""
        return self.profile.gpu.busy_speedup is not None

    def sweep_options(self) -> dict:
        # the GPU-update fill (several simulations each) only for the leaders, after the sweep
        return {"gpu_memory_bytes": self.gpu_memory_bytes, "allow_nvme": self.space.allow_nvme,
                "num_steps": self.num_steps, "fill_gpu_updates": False,
                "settle_clock": not self.settle_late}


def _exhaustive(context: _Context, settings: list[tuple[TrainSpec, Policy]], workers: int,
                progress: Callable[[int, int], None] | None) -> tuple[list[Candidate], int]:
    """Every candidate simulated; the 16 fastest filled, settled and niced (tune(exhaustive=
    True)): the ranking and how many were not tried (a smaller micro-batch overflowed)."""
    model, profile, space = context.model, context.profile, context.space
    gpu_memory_bytes, num_steps = context.gpu_memory_bytes, context.num_steps
    settle_late = context.settle_late
    options = context.sweep_options()
    jobs = [(model, train, policy, profile, options) for train, policy in settings]
    results: list[Candidate] = []
    # In waves of micro-batch, smallest first: GPU memory grows with the micro-batch (every
    # activation, workspace and checkpoint scales with its tokens), so the settings that
    # overflowed the GPU at one are not tried at a larger one. (The allocator model's
    # fragmentation could in principle let a larger one fit by a sliver: not worth its cost.)
    overflowed: set[tuple] = set()
    pruned = 0
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 and len(jobs) > 4 else None
    try:
        for micro_batch in sorted({job[1].micro_batch for job in jobs}):
            wave = [job for job in jobs if job[1].micro_batch == micro_batch]
            kept = [job for job in wave if _without_micro_batch(job) not in overflowed]
            pruned += len(wave) - len(kept)
            done = (pool.map(_evaluate_args, kept, chunksize=max(1, len(kept) // (4 * workers)))
                    if pool is not None else map(_evaluate_args, kept))
            for job, c in zip(kept, done, strict=True):
                results.append(c)
                if any(o.tier == "gpu" for o in c.prediction.overflows):
                    overflowed.add(_without_micro_batch(job))
                if progress:
                    progress(len(results) + pruned, len(jobs))
        ranked = _ranked(results)
        if space.fill_gpu_updates:
            leaders = [c for c in ranked if c.feasible][:FILL_FINALISTS]
            fill = {"gpu_memory_bytes": gpu_memory_bytes, "num_steps": num_steps,
                    "settle_clock": not settle_late}
            jobs_fill = [(model, c, profile, fill) for c in leaders]
            filled = list(pool.map(_fill_args, jobs_fill) if pool is not None and len(leaders) > 1
                          else map(_fill_args, jobs_fill))
            ranked = _ranked(filled + [c for c in ranked if not any(c is x for x in leaders)])
    finally:
        if pool is not None:
            pool.shutdown()
    if settle_late:  # the leaders again, each at the speed its GPU settles at
        settled: list[Candidate] = []

        def settle(candidate: Candidate) -> Candidate:
            settled.append(_settled(model, candidate, profile, gpu_memory_bytes, num_steps))
            return settled[-1]

        leaders = [c for c in ranked if c.feasible][:CLOCK_FINALISTS]
        ranked = _ranked([settle(c) for c in leaders]
                         + [c for c in ranked if not any(c is x for x in leaders)])
        # settling can also slow a leader (a table below 1 when busy): until the first is a
        # settled one, settle whichever leads
        while ranked and ranked[0].feasible and not any(ranked[0] is x for x in settled):
            ranked = _ranked([settle(ranked[0]), *ranked[1:]])
    if space.lanes_first:  # the GPU-bound leaders with their CPU kernels niced, as train runs them
        leaders = [c for c in ranked if c.feasible][:CLOCK_FINALISTS]
        ranked = _ranked([_lanes_first(model, c, profile, gpu_memory_bytes, num_steps)
                          for c in leaders]
                         + [c for c in ranked if not any(c is x for x in leaders)])
    return ranked, pruned


def _without_micro_batch(job: tuple) -> tuple:
    """A tune job's settings but its micro-batch (what the pruning by GPU overflow compares)."""
    train, policy = job[1], job[2]
    return train.seq_len, train.grad_accum, train.max_grad_norm, policy


# --- plans, built once ----------------------------------------------------------------------

PLAN_CACHE_SIZE = 6  # plans kept per process: a candidate's, then its settle and niceness reuse
_PLANS: OrderedDict[tuple, Plan] = OrderedDict()
# their simulations: settling a plan's clock starts with the one the sweep ran
_MEMO = SimulationMemo()


def _plan(model: ModelSpec, train: TrainSpec, policy: Policy, num_steps: int) -> Plan:
    """build_plan, remembered for the last few candidates: the settled clock and the niced
    CPU kernels simulate the same plan again (the build reads no executor knob, so plans that
    differ only there share one; each caller gets its own policy and meta)."""
    key = (model, train, policy.residency, policy.schedule, policy.kernels, num_steps)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = build_plan(model, train, policy, num_steps=num_steps)
        while len(_PLANS) > PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    out = copy.copy(plan)
    out.policy, out.meta = policy, dict(plan.meta)
    return out


_STATIC: OrderedDict[tuple, tuple] = OrderedDict()


def _static_buffers(model: ModelSpec, train: TrainSpec, policy: Policy) -> tuple:
    """planner.build.static_buffers, remembered for the last candidates' placements (the
    best-first search's bound and its sweep check the same ones)."""
    key = (model, train, policy.residency, policy.schedule, policy.kernels)
    buffers = _STATIC.get(key)
    if buffers is None:
        buffers = _STATIC[key] = static_buffers(model, train, policy)
        while len(_STATIC) > 64:
            _STATIC.popitem(last=False)
    return buffers


# --- best first -----------------------------------------------------------------------------

_CONTEXT: _Context | None = None  # the tune this process works for (a worker: set once)
_CLASSES: dict[tuple, BlockFloors] = {}
_COSTS: dict[tuple[bool, float], CostModel] = {}


def _use_context(context: _Context) -> None:
    global _CONTEXT
    if _CONTEXT is not context:
        _CONTEXT = context
        _CLASSES.clear()
        _COSTS.clear()


def _worker_start(context: _Context) -> None:
    """A worker of the best-first pool: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _use_context(context)


def _costs(lanes_first: bool, bound: bool = False, speedup: float | None = None) -> CostModel:
    """The context's cost model (each task shape costed once per process) at the policy's
    knobs: the sweep's (the tables' GPU speed), the bounds' (bound: the GPU at its largest busy
    speedup), or at `speedup`."""
    if speedup is None:
        speedup = max_gpu_speedup(_CONTEXT.profile) if bound else 1.0
    key = (lanes_first, speedup)
    costs = _COSTS.get(key)
    if costs is None:
        costs = _COSTS[key] = CostModel(_CONTEXT.profile, gpu_speedup=speedup,
                                        lanes_first=lanes_first)
        while len(_COSTS) > 8:
            _COSTS.pop(next(iter(_COSTS)))
    return costs


def _class_floors(train: TrainSpec, policy: Policy, speedup: float | None = None,
                  ) -> tuple[BlockFloors, BlockFloors]:
    key = class_key(train, policy)
    costs = _costs(policy.executor.lanes_first, bound=True, speedup=speedup)
    cached = (key, costs.gpu_speedup)
    if cached not in _CLASSES:
        _CLASSES[cached] = class_floors(_CONTEXT.model, key, costs)
    return _CLASSES[cached]


def _gpu_limit() -> int:
    return memory_limits(_CONTEXT.profile, _CONTEXT.gpu_memory_bytes)["gpu"]


def _fill(policy: Policy, headroom_bytes: float) -> list[list[int]] | None:
    if not _CONTEXT.space.fill_gpu_updates:
        return None
    return fill_takes(_CONTEXT.model, policy, headroom_bytes * GPU_FILL_MARGIN)


def _compute_floors(train: TrainSpec, policy: Policy, speedup: float | None = None,
                    ) -> BlockFloors:
    """The class plan's compute alone, without GPU casts (what a GPU-updated block keeps)."""
    if policy.schedule.cast == "gpu":
        policy = policy.with_(cast="cpu_once")
    return _class_floors(train, policy, speedup)[1]


def _class_bound(train: TrainSpec, policy: Policy, fill: list[list[int]] | None | bool = True,
                 speedup: float | None = None) -> dict[str, float]:
    """Level 0: floors from the candidate's class plans (see tuner.bounds). fill: the blocks a
    fill may take (True: as many as the whole GPU holds); speedup: the GPU's (default: its
    largest busy speedup)."""
    floors = _class_floors(train, policy, speedup)
    if fill is True:
        fill = _fill(policy, _gpu_limit())
    return class_bounds(floors[0], _compute_floors(train, policy, speedup), train.grad_accum,
                        fill, cpu=not keeps_blocks_on_gpu(policy))


def _short_bound(train: TrainSpec, policy: Policy) -> tuple[float, Candidate | None]:
    """Level 1: a tokens/s bound from a short plan of the candidate at the least NVMe placement
    whose static buffers fit (every placement tried later has at least its floors), inf where
    none fits or the GPU overflows already (those are settled without simulating, or nearly);
    and the candidate rejected, where what that plan holds on the GPU at once already
    overflows it (no placement takes GPU memory off: the candidate cannot fit)."""
    ctx = _CONTEXT
    steps, pools = _placement_steps(train, policy, ctx.space.allow_nvme)
    for *placement, prefetch, activations in steps:
        placed = _placed(policy, *placement, pools[-1], prefetch, activations)
        buffers = _static_buffers(ctx.model, train, placed)
        early = static_rejection(buffers, train.tokens_per_step, ctx.profile,
                                 gpu_memory_bytes=ctx.gpu_memory_bytes)
        if early is None:
            break
        if any(o.tier != "host" for o in early.overflows):
            return float("inf"), None
    else:
        return float("inf"), None
    plan, whole = short_plan(ctx.model, train, placed)
    limit = _gpu_limit()
    held = gpu_in_use_lower_bound(plan)
    if held > limit * (1 if whole else 1 + SHORT_PLAN_GPU_MARGIN):
        return 0.0, _rejected_on_gpu(train, placed, buffers, held)
    static_gpu = sum(b.bytes for b in buffers if b.tier == "gpu" and b.is_static)
    fill = _fill(placed, limit - static_gpu)
    floors = BlockFloors.of(plan, _costs(placed.executor.lanes_first, bound=True),
                            ctx.model.num_layers)
    merged = plan_bounds(floors, fill, _compute_floors(train, placed), train.grad_accum)
    for key, value in _class_bound(train, policy).items():
        merged[key] = max(merged.get(key, 0.0), value)
    return tokens_per_s_bound(train.tokens_per_step, merged), None


def _rejected_on_gpu(train: TrainSpec, policy: Policy, buffers, held_bytes: int) -> Candidate:
    """The candidate as rejected before its simulation: the GPU holds at least held_bytes."""
    ctx = _CONTEXT
    static = {tier: sum(b.bytes for b in buffers if b.tier == tier and b.is_static)
              for tier in TIERS}
    limits = memory_limits(ctx.profile, ctx.gpu_memory_bytes)
    runtime = sum(b.bytes for b in buffers if b.id == runtime_buffer_id("gpu"))
    prediction = Prediction(
        label="", tokens_per_step=train.tokens_per_step, limits_bytes=limits,
        peak_bytes={**static, "gpu": held_bytes}, gpu_runtime_bytes=runtime,
        overflows=(Overflow(tier="gpu", need_bytes=held_bytes, limit_bytes=limits["gpu"]),))
    return Candidate(train=train, policy=policy, prediction=prediction)


# what the exhaustive search gives its leaders after the sweep, in order
STAGES = ("fill", "settle", "nice")


def _sweep(train: TrainSpec, policy: Policy) -> tuple[Candidate, float | None]:
    """Level 2: the candidate simulated as the exhaustive sweep does (its NVMe placement), and
    a bound on what its later stages can make of it (None: they can change nothing)."""
    ctx = _CONTEXT
    candidate = evaluate(ctx.model, train, policy, ctx.profile, **ctx.sweep_options(),
                         costs=_costs(policy.executor.lanes_first))
    if not candidate.feasible:
        return candidate, None
    return candidate, _later_bound(candidate, STAGES)


def _stage(candidate: Candidate, stage: str) -> tuple[Candidate, float | None]:
    """Levels 3-5: one stage the exhaustive search gives its leaders (the GPU-update fill, the
    settled clock, the niced CPU kernels of a GPU-bound plan), and a bound on what the stages
    after it can make of the candidate (None: nothing)."""
    ctx = _CONTEXT
    model, profile, cap, steps = ctx.model, ctx.profile, ctx.gpu_memory_bytes, ctx.num_steps
    if stage == "fill":
        if ctx.space.fill_gpu_updates:
            candidate = filled_with_gpu_updates(
                model, candidate, profile, gpu_memory_bytes=cap, num_steps=steps,
                costs=_costs(candidate.policy.executor.lanes_first),
                settle_clock=not ctx.settle_late)
    elif stage == "settle":
        if ctx.settle_late:
            candidate = _settled(model, candidate, profile, cap, steps)
    elif ctx.space.lanes_first:
        candidate = _lanes_first(model, candidate, profile, cap, steps)
    rest = STAGES[STAGES.index(stage) + 1:]
    if not rest or not candidate.feasible:
        return candidate, None
    return candidate, _later_bound(candidate, rest)


def _finish(candidate: Candidate, stages: tuple[str, ...] = STAGES) -> Candidate:
    """The stages left, one after the other."""
    for stage in stages:
        candidate, _ = _stage(candidate, stage)
    return candidate


def _later_bound(candidate: Candidate, stages: tuple[str, ...]) -> float | None:
    """What the stages left can make of a feasible candidate at most (tokens/s); None where
    none of them can change its prediction (they may still change its policy: the niceness)."""
    ctx = _CONTEXT
    pred, policy, train = candidate.prediction, candidate.policy, candidate.train
    fill = (_fill(policy, pred.limits_bytes["gpu"] - pred.gpu_need_bytes)
            if "fill" in stages else None)
    settle = "settle" in stages and ctx.settle_late
    nice = ("nice" in stages and ctx.space.lanes_first and priced_apart(ctx.profile)
            and policy.executor.cpu_nice == 0
            and bool(settle or fill or lanes_first(policy, pred.bottleneck) is not None))
    if not (fill or settle or nice):
        return None
    plan = _plan(ctx.model, train, policy, ctx.num_steps)
    speedup = (_speedup_bound(candidate, plan, fill) if settle or (nice and ctx.settle_late)
               else pred.gpu_speedup)
    costs = _costs(policy.executor.lanes_first, speedup=speedup)
    floors = BlockFloors.of(plan, costs, ctx.model.num_layers)
    compute = _compute_floors(train, policy, speedup)
    bound = tokens_per_s_bound(train.tokens_per_step,
                               plan_bounds(floors, fill, compute, train.grad_accum))
    return max(pred.tokens_per_s, bound)


# a settled clock is taken this much above where the bound on it says (the settling stops
# within CLOCK_TOLERANCE of its fixed point)
SPEEDUP_SLACK = 1.01


def _speedup_bound(candidate: Candidate, plan: Plan, fill) -> float:
    """The fastest the GPU's clock can settle at for this candidate (or what its later stages
    make of it): the table's largest speedup at the busy fractions it can have. Its step does
    not grow (a fill or a niceness is kept only faster; a clock above 1 only shortens it), and
    its GPU work at speed s is at least its work at speed 1 over s (its plan's; its compute
    alone where a fill may come, without GPU casts), so it is busy at least that over s times
    its step; at most speed s then, and the bound is tightened until it holds (a table below
    1 anywhere: its largest speedup)."""
    profile = _CONTEXT.profile
    table = profile.gpu.busy_speedup
    top = max_gpu_speedup(profile)
    if table is None or any(x < 1 for _, x in table):
        return top
    policy, lanes = candidate.policy, candidate.policy.executor.lanes_first
    if fill and policy.schedule.cast == "gpu":
        work = _class_bound(candidate.train, policy, fill, speedup=1.0)["lane:gpu"]
    else:
        by_block = floors_by_block(plan, _costs(lanes, speedup=1.0),
                                   COMPUTE_KINDS if fill else None)
        work = sum(floors.get("lane:gpu", 0.0) for floors in by_block.values())
    step = candidate.prediction.step_s
    speedup = top
    for _ in range(50):
        busy = min(1.0, work / (speedup * step)) if step > 0 else 0.0
        # the table's largest speedup over busy fractions from `busy` to 1 (linear between)
        tighter = max([profile.gpu.speedup_at_busy(busy), profile.gpu.speedup_at_busy(1.0),
                       *(x for b, x in table if b >= busy)])
        if tighter >= speedup - 1e-6:
            break
        speedup = tighter
    return min(top, speedup * SPEEDUP_SLACK)


def _bound_if_beating(train: TrainSpec, policy: Policy, best_tps: float) -> float:
    """The class plans' bound on a candidate of a settling GPU, taken at the fastest its clock
    can settle at were it to beat best_tps tokens/s: its step shorter than tokens over that,
    its GPU busy at least its compute (at speed 1, over s) over that step, so at most the
    table's largest speedup from there (as _speedup_bound). At most best_tps: it cannot beat
    it."""
    profile = _CONTEXT.profile
    table = profile.gpu.busy_speedup
    top = max_gpu_speedup(profile)
    speedup = top
    if table is not None and not any(x < 1 for _, x in table) and best_tps > 0:
        work = _class_bound(train, policy, speedup=1.0)["lane:gpu"]
        step = train.tokens_per_step / best_tps
        for _ in range(50):
            busy = min(1.0, work / (speedup * step))
            tighter = max([profile.gpu.speedup_at_busy(busy), profile.gpu.speedup_at_busy(1.0),
                           *(x for b, x in table if b >= busy)])
            if tighter >= speedup - 1e-6:
                break
            speedup = tighter
        speedup = min(top, speedup * SPEEDUP_SLACK)
    return tokens_per_s_bound(train.tokens_per_step,
                              _class_bound(train, policy, speedup=speedup))


def _level_work(level: int, i: int, search: _BestFirst) -> tuple:
    """The function and arguments that take candidate i past `level`."""
    if level == 0:
        return (_short_bound, *search.settings[i])
    if level == 1:
        return (_sweep, *search.settings[i])
    return (_stage, search.latest[i], STAGES[level - 2])


class _Done:
    """A result already there (the search without a pool works as if through one)."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class _BestFirst:
    """tune's best-first search. Each candidate goes through levels, each giving a tighter
    upper bound on its tokens/s (tuner.bounds): its class plans' (all at once, first), a short
    plan's, its sweep simulation (with a bound on what the later stages can add), and last its
    fill, settled clock and niceness: its final tokens/s. The candidate with the highest bound
    goes a level on, on each of `workers` processes, until no bound beats the best final
    tokens/s found (by more than `tolerance` of it). Candidates whose smaller micro-batch
    overflowed the GPU are not tried, as in the exhaustive sweep."""

    def __init__(self, context: _Context, settings: list[tuple[TrainSpec, Policy]],
                 workers: int, progress: Callable[[int, int], None] | None, tolerance: float,
                 interruptible: bool = True):
        self.context, self.settings = context, settings
        self.interruptible = interruptible
        self.workers, self.progress, self.tolerance = max(1, workers), progress, tolerance
        self.latest: dict[int, Candidate] = {}  # each simulated candidate's latest
        self.stages_done: dict[int, int] = {}  # how many of STAGES each has been through
        self.sweep_tps: dict[int, float] = {}  # what the sweep said of each (ties: the faster)
        self.finished: set[int] = set()
        self.best: int | None = None
        self.overflowed: dict[tuple, int] = {}  # settings -> smallest micro-batch over the GPU
        self.dive: list[tuple] = []  # the candidate taken on to its end before any other
        self.pruned = 0

    def threshold(self) -> float:
        if self.best is None:
            return -1.0
        return self.latest[self.best].prediction.tokens_per_s * (1 + self.tolerance)

    def skipped(self, i: int) -> bool:
        train, policy = self.settings[i]
        smallest = self.overflowed.get(_without_micro_batch((None, train, policy)))
        return smallest is not None and smallest < train.micro_batch

    def run(self) -> tuple[list[Candidate], int, int, bool]:
        _use_context(self.context)
        heap = []
        for i, (train, policy) in enumerate(self.settings):
            bound = tokens_per_s_bound(train.tokens_per_step, _class_bound(train, policy))
            heap.append((-bound, i, 0))
        heapq.heapify(heap)
        pool = (ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_start,
                                    initargs=(self.context,))
                if self.workers > 1 and len(heap) > 1 else None)
        inflight: dict = {}
        interrupted = False
        try:
            while True:
                threshold = self.threshold()
                while len(inflight) < self.workers and (
                        self.dive or (heap and -heap[0][0] > threshold)):
                    # until a candidate has been finished, the one simulated first goes on
                    # (a best to prune with, early); then the highest bound
                    neg, i, level = self.dive.pop() if self.dive else heapq.heappop(heap)
                    if level < 2 and self.skipped(i):
                        self.pruned += 1
                        continue
                    if level < 2 and self.context.settle_late and self.best is not None:
                        # were it to beat the best, its clock could settle only so fast
                        refined = _bound_if_beating(*self.settings[i], threshold)
                        if refined < -neg:
                            if refined > threshold:
                                heapq.heappush(heap, (-refined, i, level))
                            continue
                    work = _level_work(level, i, self)
                    future = (pool.submit(*work) if pool is not None
                              else _Done(work[0](*work[1:])))
                    inflight[future] = (i, level, -neg)
                if not inflight:
                    break
                done = (wait(inflight, return_when=FIRST_COMPLETED)[0] if pool is not None
                        else list(inflight))
                for future in done:
                    i, level, bound = inflight.pop(future)
                    self.handle(heap, i, level, bound, future.result())
                self.report(heap, len(inflight))
        except KeyboardInterrupt:
            interrupted = True
            if not self.interruptible:
                raise
        finally:
            if pool is not None:
                _stop(pool, interrupted)
        if not interrupted:
            self.finish_ahead_of_best()
        order = sorted(self.latest)  # the settings' order: ties rank as in the sweep
        ranked = _ranked([self.latest[i] for i in order])
        if self.best is not None and not interrupted:
            # the best finished first (an unfinished one ahead of it only ties it)
            best = self.latest[self.best]
            ranked = [best, *(c for c in ranked if c is not best)]
        bounded = len(self.settings) - len(self.latest) - self.pruned
        if self.progress and not interrupted:
            self.progress(len(self.settings), len(self.settings))
        return ranked, self.pruned, bounded, interrupted

    def handle(self, heap: list, i: int, level: int, bound: float, result) -> None:
        if level == 0:  # a short plan's bound, or the candidate rejected on the GPU
            tighter, rejected = result
            if rejected is not None:
                self.sweep_done(i, rejected)
            else:
                heapq.heappush(heap, (-min(bound, tighter), i, 1))
            return
        candidate, later = result
        if level == 1:  # the sweep's simulation
            self.sweep_done(i, candidate)
            if not candidate.feasible:
                return
        else:
            self.latest[i] = candidate
        self.stages_done[i] = level - 1
        if later is None:  # nothing left can move it: finished (its niceness, cheaply)
            self.finished_with(i, _finish(candidate, STAGES[level - 1:]))
        elif self.best is None and not self.dive:
            self.dive.append((-min(bound, later), i, level + 1))
        else:
            heapq.heappush(heap, (-min(bound, later), i, level + 1))

    def sweep_done(self, i: int, candidate: Candidate) -> None:
        self.latest[i] = candidate
        self.sweep_tps[i] = candidate.prediction.tokens_per_s or 0.0
        if any(o.tier == "gpu" for o in candidate.prediction.overflows):
            key = _without_micro_batch((None, *self.settings[i]))
            mb = candidate.train.micro_batch
            self.overflowed[key] = min(self.overflowed.get(key, mb), mb)

    def finished_with(self, i: int, candidate: Candidate) -> None:
        self.latest[i] = candidate
        self.finished.add(i)
        if not candidate.feasible:
            return
        # ties go as the exhaustive search's stable sorts leave them: the faster in the sweep,
        # then the first in the space
        key = (candidate.prediction.tokens_per_s, self.sweep_tps.get(i, 0.0), -i)
        best = self.best
        if best is None or key > (self.latest[best].prediction.tokens_per_s,
                                  self.sweep_tps.get(best, 0.0), -best):
            self.best = i

    def finish_ahead_of_best(self) -> None:
        """With a tolerance, a simulated candidate may stand above the best unfinished: finish
        those (its fill, clock and niceness) until the best is ahead of every one."""
        while True:
            best = self.threshold() / (1 + self.tolerance) if self.best is not None else -1.0
            ahead = [i for i, c in self.latest.items() if i not in self.finished
                     and c.feasible and c.prediction.tokens_per_s > best]
            if not ahead:
                return
            for i in ahead:
                done = self.stages_done.get(i, 0)
                self.finished_with(i, _finish(self.latest[i], STAGES[done:]))

    def report(self, heap: list, inflight: int) -> None:
        if not self.progress:
            return
        threshold = self.threshold()
        left = sum(1 for neg, i, level in heap if -neg > threshold and level < 2) + inflight
        done = len(self.latest) + self.pruned
        self.progress(done, max(done + left, done))


def _stop(pool: ProcessPoolExecutor, now: bool) -> None:
    """Shut the pool down; on Ctrl-C without waiting for the candidates in flight."""
    if not now:
        pool.shutdown()
        return
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
