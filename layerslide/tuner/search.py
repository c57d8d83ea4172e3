"""tune: search training settings and policies with the simulator under memory limits.

For each candidate (window, micro-batch, accumulation, activation placement, cast, optimizer
order) the optimizer-state placement is the least NVMe use that fits the host: NVMe only ever
slows a step down, so a candidate gets RAM first; while the host overflows it first bounds the
pinned gradient landing buffers, then spills moments, then master weights, then (from the
host) the activation checkpoints to NVMe.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Plan, Policy, TrainSpec, build_plan, sizes
from layerslide.planner.build import (
    build_repeatable_plan,
    gpu_layout,
    gpu_update_candidates,
    static_buffers,
)
from layerslide.planner.plan import STEADY_STEPS
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
from layerslide.simulator import CostModel, Prediction, simulate, static_rejection
from layerslide.trace import TIERS
from layerslide.tuner.lanes_first import niced_where_gpu_bound

# (moments_on_nvme, master_on_nvme), least NVMe first (then WEIGHT_SPILLS).
NVME_PLACEMENTS = ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (1.0, 0.5), (1.0, 1.0))
GPU_FILL_MARGIN = 0.95  # of the free GPU memory, for what the estimate does not see
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


def _gpu_update_blocks_fitting(model: ModelSpec, headroom_bytes: float, order: str,
                               moment_precision: str = "fp32") -> int:
    """How many blocks, taken in the order's sequence, fit their GPU state into the headroom."""
    used, count = 0.0, 0
    rate = sizes.gpu_updated_bytes_per_param(moment_precision)
    for block in gpu_update_candidates(model.num_layers, order):
        used += rate * model.block_params(block)
        if used > headroom_bytes:
            break
        count += 1
    return count


def evaluate(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile, *,
             gpu_memory_bytes: int | None, allow_nvme: bool, num_steps: int,
             fill_gpu_updates: bool = False, settle_clock: bool = True) -> Candidate:
    """Simulate one candidate with the least NVMe use that fits, then (if asked) with GPU
    memory it leaves free given to blocks updated on the GPU; if nothing fits, the last try
    (or the first that overflows a tier that more NVMe cannot relieve). settle_clock=False
    holds the GPU at its efficiency tables' rate (simulate's busy speedup left out)."""
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
        count = _gpu_update_blocks_fitting(model, headroom, order,
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


def _place_state(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile,
                 *, gpu_memory_bytes: int | None, allow_nvme: bool, num_steps: int,
                 costs: CostModel, settle_clock: bool) -> Candidate:
    """The least NVMe use (and pinned grad buffers) under which the candidate fits the host;
    with all state on NVMe and the host still over, one block's state staged at a time, then
    the checkpoints, then the bf16 weights on NVMe."""
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
    coarse = {step[:3] for step in steps}
    pools = [policy.residency.host_grad_buffers]
    if (train.max_grad_norm is None and policy.residency.host_grad_buffers is None
            and not grads_land_in_upload(policy, train)):
        # clipping holds every grad (no pool to bound); grads landing in the upload copies
        # have no landing buffers to bound
        pools.append(BOUNDED_LANDING_BUFFERS)

    def attempt(moments: float, master: float, weights: float, pool, prefetch: int,
                activations: str) -> Candidate:
        tried = policy.with_(moments_on_nvme=moments, master_on_nvme=master,
                             weights_on_nvme=weights, host_grad_buffers=pool,
                             nvme_prefetch=prefetch, activations=activations)
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
    early = static_rejection(static_buffers(model, train, policy), train.tokens_per_step,
                             profile, gpu_memory_bytes=gpu_memory_bytes)
    if early is not None:
        return early
    plan = build_plan(model, train, policy, num_steps=num_steps)
    return simulate(plan, profile, gpu_memory_bytes=gpu_memory_bytes, costs=costs,
                    settle_clock=settle_clock)


def _ranked(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (not c.feasible, -(c.prediction.tokens_per_s or 0.0)))


def _settled(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
             gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate's own placement simulated again with the GPU's clock settled."""
    plan = build_plan(model, candidate.train, candidate.policy, num_steps=num_steps)
    prediction = simulate(plan, profile, gpu_memory_bytes=gpu_memory_bytes)
    return replace(candidate, prediction=replace(prediction, trace=None))


def _lanes_first(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
                 gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate with its CPU kernels niced where it is GPU-bound (tuner.lanes_first)."""
    found = niced_where_gpu_bound(
        candidate.policy, candidate.prediction, profile,
        lambda policy: simulate(build_plan(model, candidate.train, policy, num_steps=num_steps),
                                profile, gpu_memory_bytes=gpu_memory_bytes))
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
         progress: Callable[[int, int], None] | None = None) -> TuneResult:
    """Evaluate every candidate of the space; best tokens/s first, infeasible ones last."""
    space = space or SearchSpace()
    base = base_policy or Policy.of()
    settle_late = profile.gpu.busy_speedup is not None
    # the GPU-update fill (several simulations each) only for the leaders, after the sweep
    options = {"gpu_memory_bytes": gpu_memory_bytes, "allow_nvme": space.allow_nvme,
               "num_steps": num_steps, "fill_gpu_updates": False,
               "settle_clock": not settle_late}
    if seq_len > model.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds {model.name}'s "
                         f"max_position_embeddings={model.max_position_embeddings}")
    jobs = [(model, train, policy, profile, options)
            for train, policy in space.candidates(seq_len, max_grad_norm, base)]
    if not jobs:
        raise ValueError(f"no candidate has at most max_tokens_per_step="
                         f"{space.max_tokens_per_step} tokens per step at seq_len={seq_len}: "
                         "raise the cap (--max-tokens-per-step) or try smaller micro-batches")
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
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
    best_plan = None
    if ranked and ranked[0].feasible:
        best = ranked[0]
        best_plan = build_plan(model, best.train, best.policy, num_steps=num_steps)
        if best_plan.reach_steps() >= best_plan.num_steps:  # so that train can repeat it
            best_plan = build_repeatable_plan(model, best.train, best.policy)
        best_plan.meta.update({
            "tuned_for_profile": profile.name,
            "tuned_for_nvme_drives": profile.storage.drives,
            "gpu_memory_bytes": gpu_memory_bytes,
            "prediction": best.prediction.summary(),
        })
    return TuneResult(candidates=tuple(ranked), best_plan=best_plan, pruned=pruned)


def _without_micro_batch(job: tuple) -> tuple:
    """A tune job's settings but its micro-batch (what the pruning by GPU overflow compares)."""
    train, policy = job[1], job[2]
    return train.seq_len, train.grad_accum, train.max_grad_norm, policy
