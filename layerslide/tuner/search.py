"""tune: search training settings and policies with the simulator under memory limits.

Each candidate of a SearchSpace (tuner.space) gets the least NVMe use that fits the host
(tuner.placement); the leaders then get a GPU-update fill, a settled clock and niced CPU
kernels (tuner.stages). By default the search is best first (tuner.best_first): candidates
are bounded without simulating them (tuner.bounds) and only those that can still beat the
best are simulated; tune(exhaustive=True) simulates every one (tuner.exhaustive).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Plan, Policy
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.plan import STEADY_STEPS
from layerslide.simulator.ranks import check_ranks
from layerslide.tuner.best_first import BestFirst, Outcome
from layerslide.tuner.context import TuneContext
from layerslide.tuner.exhaustive import exhaustive as exhaustive_search
from layerslide.tuner.plans import collector_paused, plan_of
from layerslide.tuner.space import Candidate, SearchSpace

MAX_WORKERS = 8  # processes a tune uses at most (default: one per core up to this)


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """All candidates, best first; the best feasible one (if any) with its plan (unless tune
    was asked for none)."""

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


def tune(model: ModelSpec, profile: HardwareProfile, *, seq_len: int = 1024,
         max_grad_norm: float | None = None, space: SearchSpace | None = None,
         base_policy: Policy | None = None, gpu_memory_bytes: int | None = None,
         num_steps: int = STEADY_STEPS, workers: int | None = None,
         progress: Callable[[int, int], None] | None = None, exhaustive: bool = False,
         tolerance: float = 0.0, interruptible: bool = True,
         with_plan: bool = True, gpus: int = 1, hosts: int = 1) -> TuneResult:
    """The best candidate of the space and its plan; candidates best tokens/s first,
    infeasible ones last.

    By default best first (tuner.best_first): only the candidates whose bound beats the best
    found so far are simulated, best bound first, each then given the GPU-update fill, the
    settled clock and the niceness the exhaustive search gives its leaders; `tolerance` (a
    fraction) also drops those that could beat it by no more than that. exhaustive=True
    simulates every candidate of the space and gives the 16 fastest the later stages (the
    search as it was, for comparison). Ctrl-C (KeyboardInterrupt) during the best-first search
    returns the best found so far (TuneResult.interrupted); interruptible=False lets it
    through (a sweep of many tunes stops as a whole). with_plan=False leaves the best plan
    unbuilt (a what-if row reads only the prediction). gpus, hosts: the ranks every candidate
    runs on (one rank simulated on its share of the host; tokens/s and the token cap are every
    rank's); with several, no block is updated on the GPU (the planner refuses it)."""
    space = space or SearchSpace()
    check_ranks(profile, gpus, hosts)
    base = base_policy or Policy.of()
    if seq_len > model.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds {model.name}'s "
                         f"max_position_embeddings={model.max_position_embeddings}")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance!r}: give a fraction in [0, 1)")
    settings = list(space.candidates(seq_len, max_grad_norm, base, gpus, hosts))
    if not settings:
        ranks = f" over {gpus * hosts} ranks" if gpus * hosts > 1 else ""
        raise ValueError(f"no candidate has at most max_tokens_per_step="
                         f"{space.max_tokens_per_step} tokens per step{ranks} at "
                         f"seq_len={seq_len}: raise the cap (--max-tokens-per-step) or try "
                         "smaller micro-batches" + (" or fewer ranks" if ranks else ""))
    workers = workers if workers is not None else min(os.cpu_count() or 1, MAX_WORKERS)
    context = TuneContext(model=model, profile=profile, space=space,
                          gpu_memory_bytes=gpu_memory_bytes, num_steps=num_steps, gpus=gpus,
                          hosts=hosts)
    found = _search(context, settings, workers, progress, exhaustive, tolerance, interruptible)
    best = found.ranked[0] if found.ranked and found.ranked[0].feasible else None
    return TuneResult(candidates=tuple(found.ranked), pruned=found.pruned,
                      bounded=found.bounded, interrupted=found.interrupted,
                      searched=len(settings),
                      best_plan=(_best_plan(context, best) if best is not None and with_plan
                                 else None))


def _search(context: TuneContext, settings: list, workers: int, progress, exhaustive: bool,
            tolerance: float, interruptible: bool) -> Outcome:
    """The exhaustive or the best-first search of the settings. The cycle collector is off
    throughout: a tune's plans and simulations free themselves by refcount (tuner.plans), and
    each collection would walk every plan kept."""
    with collector_paused(freeze=True):
        if exhaustive:
            order, pruned = exhaustive_search(context, settings, workers, progress)
            return Outcome(ranked=order, pruned=pruned, bounded=0, interrupted=False)
        return BestFirst(context, settings, workers, progress, tolerance, interruptible).run()


def _best_plan(context: TuneContext, best: Candidate) -> Plan:
    """The pick's plan, repeatable by train, with what it was tuned for in its meta."""
    plan = plan_of(context.model, best.train, best.policy, context.num_steps)
    if plan.reach_steps() >= plan.num_steps:  # so that train can repeat it
        plan = build_repeatable_plan(context.model, best.train, best.policy)
    else:
        plan.validate()  # the search's plans were not (tuner.plans)
    plan.meta.update({
        "tuned_for_profile": context.profile.name,
        "tuned_for_nvme_drives": context.profile.storage.drives,
        "gpu_memory_bytes": context.gpu_memory_bytes,
        "prediction": best.prediction.summary(),
    })
    return plan
