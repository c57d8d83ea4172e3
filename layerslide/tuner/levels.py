"""The levels a candidate goes through in the best-first search (tuner.best_first), each giving
a tighter upper bound on its tokens/s (tuner.bounds) or its final prediction:

0. its class plans' bound (one decoder layer, one micro-batch; cached per class);
1. a short plan's bound, or its rejection where that plan already overflows the GPU;
2. its sweep simulation (as the exhaustive search's), and a bound on what the stages can add;
3-5. each of STAGES (fill, settle, nice), and a bound on what the stages left can add.

A process works for one tune at a time: `Levels` holds its context and the cost models and
class floors it reuses; run_level is what a worker process runs."""

from __future__ import annotations

import gc
import signal
from dataclasses import replace

from layerslide.kinds import COMPUTE_KINDS
from layerslide.planner import Plan, Policy, TrainSpec
from layerslide.simulator import CostModel, memory_limits
from layerslide.simulator.predict import floors_by_block
from layerslide.tuner.bounds import (
    DEPTH_PROBE_LAYERS,
    GPU_FILL_MARGIN,
    SHORT_PLAN_GPU_MARGIN,
    BlockFloors,
    class_bounds,
    class_floors,
    class_key,
    class_plan_settings,
    fill_takes,
    gpu_in_use_lower_bound,
    keeps_blocks_on_gpu,
    max_gpu_speedup,
    plan_bounds,
    settled_speedup_bound,
    short_plan_model,
    tokens_per_s_bound,
)
from layerslide.tuner.context import TuneContext
from layerslide.tuner.lanes_first import lanes_first, priced_apart
from layerslide.tuner.placement import placed_policy, placement_steps
from layerslide.tuner.plans import (
    plan_of,
    rejected_early,
    rejected_on_gpu,
    small_plan_of,
    static_buffers_of,
)
from layerslide.tuner.space import Candidate
from layerslide.tuner.stages import STAGES, evaluate, filled_with_gpu_updates, niced, settled

COST_MODELS_KEPT = 8  # cost models per process: (lanes_first, GPU speed) pairs


class Levels:
    """One tune's levels, in one process."""

    def __init__(self, context: TuneContext):
        self.context = context
        self._classes: dict[tuple, tuple[BlockFloors, BlockFloors]] = {}
        self._costs: dict[tuple[bool, float], CostModel] = {}
        self.gpu_limit = memory_limits(context.profile, context.gpu_memory_bytes)["gpu"]

    # --- what the levels share ----------------------------------------------------------------
    def costs(self, lanes_first: bool, bound: bool = False,
              speedup: float | None = None) -> CostModel:
        """The context's cost model (each task shape costed once per process) at the policy's
        knobs: the sweep's (the tables' GPU speed), the bounds' (bound: the GPU at its largest
        busy speedup), or at `speedup`."""
        if speedup is None:
            speedup = max_gpu_speedup(self.context.profile) if bound else 1.0
        key = (lanes_first, speedup)
        costs = self._costs.get(key)
        if costs is None:
            costs = self._costs[key] = CostModel(
                self.context.profile, gpu_speedup=speedup, lanes_first=lanes_first,
                gpus=self.context.gpus, hosts=self.context.hosts)
            while len(self._costs) > COST_MODELS_KEPT:
                self._costs.pop(next(iter(self._costs)))
        return costs

    def class_floors(self, train: TrainSpec, policy: Policy,
                     speedup: float | None = None) -> tuple[BlockFloors, BlockFloors]:
        key = class_key(train, policy)
        costs = self.costs(policy.executor.lanes_first, bound=True, speedup=speedup)
        cached = (key, costs.gpu_speedup)
        if cached not in self._classes:
            model = self.context.model
            plan = small_plan_of(*class_plan_settings(model, key))
            self._classes[cached] = class_floors(plan, costs, model.num_layers)
        return self._classes[cached]

    def compute_floors(self, train: TrainSpec, policy: Policy,
                       speedup: float | None = None) -> BlockFloors:
        """The class plan's compute alone, without GPU casts (what a GPU-updated block
        keeps)."""
        if policy.schedule.cast == "gpu":
            policy = policy.with_(cast="cpu_once")
        return self.class_floors(train, policy, speedup)[1]

    def fill(self, policy: Policy, headroom_bytes: float) -> list[list[int]] | None:
        """The blocks a GPU-update fill could take into headroom_bytes (None: none)."""
        if not self.context.fills_gpu_updates:
            return None
        return fill_takes(self.context.model, policy, headroom_bytes * GPU_FILL_MARGIN)

    # --- level 0 ------------------------------------------------------------------------------
    def class_bound(self, train: TrainSpec, policy: Policy,
                    fill: list[list[int]] | None | bool = True,
                    speedup: float | None = None) -> dict[str, float]:
        """Floors from the candidate's class plans (see tuner.bounds). fill: the blocks a fill
        may take (True: as many as the whole GPU holds); speedup: the GPU's (default: its
        largest busy speedup)."""
        floors = self.class_floors(train, policy, speedup)
        if fill is True:
            fill = self.fill(policy, self.gpu_limit)
        return class_bounds(floors[0], self.compute_floors(train, policy, speedup),
                            train.grad_accum, fill, cpu=not keeps_blocks_on_gpu(policy))

    def class_tokens_per_s(self, train: TrainSpec, policy: Policy) -> float:
        return tokens_per_s_bound(train.global_tokens_per_step, self.class_bound(train, policy))

    def bound_if_beating(self, train: TrainSpec, policy: Policy, best_tps: float) -> float:
        """The class plans' bound on a candidate of a settling GPU, taken at the fastest its
        clock can settle at were it to beat best_tps tokens/s: its step shorter than tokens
        over that, its GPU busy at least its compute (at speed 1) over that step."""
        if best_tps <= 0:
            return self.class_tokens_per_s(train, policy)
        work = self.class_bound(train, policy, speedup=1.0)["lane:gpu"]
        speedup = settled_speedup_bound(self.context.profile, work,
                                        train.global_tokens_per_step / best_tps)
        return tokens_per_s_bound(train.global_tokens_per_step,
                                  self.class_bound(train, policy, speedup=speedup))

    # --- level 1 ------------------------------------------------------------------------------
    def short_bound(self, train: TrainSpec, policy: Policy) -> tuple[float, Candidate | None]:
        """A tokens/s bound from a short plan of the candidate at the least NVMe placement
        whose static buffers fit (every placement tried later has at least its floors), inf
        where none fits or the GPU overflows already (those are settled without simulating,
        or nearly); and the candidate rejected, where what that plan holds on the GPU at once
        already overflows it (no placement takes GPU memory off: the candidate cannot fit)."""
        ctx = self.context
        first = self._least_placement(train, policy)
        if first is None:
            return float("inf"), None
        placed, buffers = first
        short, whole = short_plan_model(ctx.model, placed)
        plan = small_plan_of(short, train, placed)
        held = self._held_at_depth(plan, whole, train, placed)
        if held > self.gpu_limit * (1 if whole else 1 + SHORT_PLAN_GPU_MARGIN):
            return 0.0, self._rejected_on_gpu(train, placed, buffers, held)
        static_gpu = sum(b.bytes for b in buffers if b.tier == "gpu" and b.is_static)
        fill = self.fill(placed, self.gpu_limit - static_gpu)
        floors = BlockFloors.of(plan, self.costs(placed.executor.lanes_first, bound=True),
                                ctx.model.num_layers)
        merged = plan_bounds(floors, fill, self.compute_floors(train, placed), train.grad_accum)
        for key, value in self.class_bound(train, policy).items():
            merged[key] = max(merged.get(key, 0.0), value)
        return tokens_per_s_bound(train.global_tokens_per_step, merged), None

    def _held_at_depth(self, plan: Plan, whole: bool, train: TrainSpec, policy: Policy) -> int:
        """What the deep plan holds on the GPU at once (gpu_in_use_lower_bound), from its short
        plan: where the checkpoints stay on the GPU, each decoder layer more holds one layer's
        more, as a plan DEPTH_PROBE_LAYERS deeper than the short one shows (tests/tuner hold
        the two equal); elsewhere the short plan's own."""
        held = gpu_in_use_lower_bound(plan)
        layers, short = self.context.model.num_layers, plan.model
        if whole or policy.residency.activations != "gpu":
            return held
        probe = min(DEPTH_PROBE_LAYERS, layers - short.num_layers)
        deeper = small_plan_of(replace(short, num_layers=short.num_layers + probe), train, policy)
        per_layer = max(0.0, (gpu_in_use_lower_bound(deeper) - held) / probe)
        return held + int(per_layer * (layers - short.num_layers))

    def _least_placement(self, train: TrainSpec, policy: Policy) -> tuple[Policy, tuple] | None:
        """The first of place_state's placements whose static buffers fit (the policy and its
        buffers); None where none does, or one overflows another tier than the host."""
        ctx = self.context
        steps, pools = placement_steps(train, policy, ctx.space.allow_nvme)
        for *placement, prefetch, activations in steps:
            placed = placed_policy(policy, *placement, pools[-1], prefetch, activations)
            buffers = static_buffers_of(ctx.model, train, placed)
            early = rejected_early(buffers, train, ctx.profile, ctx.gpu_memory_bytes)
            if early is None:
                return placed, buffers
            if any(o.tier != "host" for o in early.overflows):
                return None
        return None

    def _rejected_on_gpu(self, train: TrainSpec, policy: Policy, buffers,
                         held_bytes: int) -> Candidate:
        """The candidate as rejected before its simulation: the GPU holds at least
        held_bytes."""
        ctx = self.context
        return Candidate(train=train, policy=policy, prediction=rejected_on_gpu(
            buffers, train, ctx.profile, ctx.gpu_memory_bytes, held_bytes))

    # --- levels 2-5 ---------------------------------------------------------------------------
    def sweep(self, train: TrainSpec, policy: Policy) -> tuple[Candidate, float | None]:
        """The candidate simulated as the exhaustive sweep does (its NVMe placement), and a
        bound on what its later stages can make of it (None: they can change nothing)."""
        ctx = self.context
        candidate = evaluate(ctx.model, train, policy, ctx.profile, **ctx.sweep_options(),
                             costs=self.costs(policy.executor.lanes_first))
        if not candidate.feasible:
            return candidate, None
        return candidate, self.later_bound(candidate, STAGES)

    def stage(self, candidate: Candidate, stage: str,
              beat: float = -1.0) -> tuple[Candidate, float | None]:
        """One stage the exhaustive search gives its leaders (the GPU-update fill, the settled
        clock, the niced CPU kernels of a GPU-bound plan), and a bound on what the stages
        after it can make of the candidate (None: nothing). A fill tries no blocks whose bound
        cannot beat `beat` tokens/s (the best so far): the candidate is then no pick."""
        ctx = self.context
        model, profile, cap, steps = ctx.model, ctx.profile, ctx.gpu_memory_bytes, ctx.num_steps
        if stage == "fill":
            if ctx.fills_gpu_updates:
                base = candidate
                candidate = filled_with_gpu_updates(
                    model, base, profile, gpu_memory_bytes=cap, num_steps=steps,
                    costs=self.costs(base.policy.executor.lanes_first),
                    settle_clock=not ctx.settle_late,
                    worth_trying=lambda blocks: self._bound(
                        base, [list(blocks)], ctx.settle_late, beat) > beat)
        elif stage == "settle":
            if ctx.settle_late:
                candidate = settled(model, candidate, profile, cap, steps)
        elif ctx.space.lanes_first:
            candidate = niced(model, candidate, profile, cap, steps)
        rest = STAGES[STAGES.index(stage) + 1:]
        if not rest or not candidate.feasible:
            return candidate, None
        return candidate, self.later_bound(candidate, rest, beat)

    def finish(self, candidate: Candidate, stages: tuple[str, ...] = STAGES) -> Candidate:
        """The stages left, one after the other."""
        for stage in stages:
            candidate, _ = self.stage(candidate, stage)
        return candidate

    def later_bound(self, candidate: Candidate, stages: tuple[str, ...],
                    beat: float = -1.0) -> float | None:
        """What the stages left can make of a feasible candidate at most (tokens/s), where that
        beats `beat` tokens/s (below it, the bound only says it cannot); None where none of
        them can change its prediction (they may still change its policy: the niceness)."""
        ctx = self.context
        pred, policy = candidate.prediction, candidate.policy
        fill = (self.fill(policy, pred.limits_bytes["gpu"] - pred.gpu_need_bytes)
                if "fill" in stages else None)
        settle = "settle" in stages and ctx.settle_late
        nice = ("nice" in stages and ctx.space.lanes_first and priced_apart(ctx.profile)
                and policy.executor.cpu_nice == 0
                and bool(settle or fill or lanes_first(policy, pred.bottleneck) is not None))
        if not (fill or settle or nice):
            return None
        return max(pred.tokens_per_s,
                   self._bound(candidate, fill, settle or (nice and ctx.settle_late), beat))

    def _bound(self, candidate: Candidate, fill: list[list[int]] | None,
               settling: bool, beat: float = -1.0) -> float:
        """The tokens/s bound on a simulated candidate from its own plan's floors, less what a
        fill taking one of `fill`'s block lists takes off them, the GPU at the fastest its
        clock can settle at where it is still to settle (else at its own speed): were it to
        beat `beat` tokens/s, at the fastest a step that short lets it settle at."""
        ctx = self.context
        pred, policy, train = candidate.prediction, candidate.policy, candidate.train
        plan = plan_of(ctx.model, train, policy, ctx.num_steps)
        step_s = pred.step_s
        if beat > 0:
            step_s = min(step_s, train.global_tokens_per_step / beat)
        speedup = (self._speedup_bound(candidate, plan, fill, step_s) if settling
                   else pred.gpu_speedup)
        costs = self.costs(policy.executor.lanes_first, speedup=speedup)
        floors = BlockFloors.of(plan, costs, ctx.model.num_layers)
        compute = self.compute_floors(train, policy, speedup)
        return tokens_per_s_bound(train.global_tokens_per_step,
                                  plan_bounds(floors, fill, compute, train.grad_accum))

    def _speedup_bound(self, candidate: Candidate, plan, fill, step_s: float) -> float:
        """The fastest the GPU's clock can settle at for this candidate (or what its later
        stages make of it) in a step of at most step_s. Its step does not grow (a fill or a
        niceness is kept only faster; a clock above 1 only shortens it), and its GPU work at
        speed 1 is its plan's (its compute alone where a fill may come, without GPU casts)."""
        policy, lanes = candidate.policy, candidate.policy.executor.lanes_first
        if fill and policy.schedule.cast == "gpu":
            work = self.class_bound(candidate.train, policy, fill, speedup=1.0)["lane:gpu"]
        else:
            by_block = floors_by_block(plan, self.costs(lanes, speedup=1.0),
                                       COMPUTE_KINDS if fill else None)
            work = sum(floors.get("lane:gpu", 0.0) for floors in by_block.values())
        return settled_speedup_bound(self.context.profile, work, step_s)


# --- in a worker process ------------------------------------------------------------------------

_LEVELS: Levels | None = None  # the tune this process works for (a worker: set once)


def levels_for(context: TuneContext) -> Levels:
    """This process's Levels for the context (new caches for a new tune)."""
    global _LEVELS
    if _LEVELS is None or _LEVELS.context is not context:
        _LEVELS = Levels(context)
    return _LEVELS


def worker_start(context: TuneContext) -> None:
    """A worker of the best-first pool: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.disable()  # for this tune's life, as in its parent (tuner.plans frees plans whole)
    levels_for(context)


def run_level(name: str, *args):
    """One level's work in this process: Levels.<name>(*args)."""
    return getattr(_LEVELS, name)(*args)
