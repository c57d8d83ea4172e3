"""tune(exhaustive=True): every candidate of the space simulated, the 16 fastest then filled
with GPU-updated blocks, settled and niced (the search before bounds, kept to compare the
best-first one against: benchmarks/planning_speed.py)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from layerslide.planner import Policy, TrainSpec
from layerslide.tuner.context import TuneContext, without_micro_batch
from layerslide.tuner.space import Candidate, ranked
from layerslide.tuner.stages import evaluate, filled_with_gpu_updates, niced, settled

# Candidates simulated again with the GPU's clock settled against its busy fraction (profiles
# with GPUSpec.busy_speedup) before the final ranking; the sweep itself holds the clock at the
# efficiency tables' rate, which takes one simulation per try instead of two or three.
CLOCK_FINALISTS = 16
# The fastest candidates of the sweep that then try filling the GPU memory they leave free with
# blocks updated on the GPU (each try a simulation): a fill speeds a candidate up when the CPU
# bounds it, rarely enough to overtake one this far down.
FILL_FINALISTS = 16


def exhaustive(context: TuneContext, settings: list[tuple[TrainSpec, Policy]], workers: int,
               progress: Callable[[int, int], None] | None) -> tuple[list[Candidate], int]:
    """Every candidate simulated; the 16 fastest filled, settled and niced: the ranking and
    how many were not tried (a smaller micro-batch overflowed)."""
    pool = (ProcessPoolExecutor(max_workers=workers) if workers > 1 and len(settings) > 4
            else None)
    try:
        results, pruned = _sweep(context, settings, pool, workers, progress)
        order = ranked(results)
        if context.fills_gpu_updates:
            order = _filled(context, order, pool)
    finally:
        if pool is not None:
            pool.shutdown()
    if context.settle_late:
        order = _settled(context, order)
    if context.space.lanes_first:  # the GPU-bound leaders niced, as train runs them
        c = context
        leaders = [x for x in order if x.feasible][:CLOCK_FINALISTS]
        order = _with_leaders([niced(c.model, x, c.profile, c.gpu_memory_bytes, c.num_steps)
                               for x in leaders], leaders, order)
    return order, pruned


def _sweep(context: TuneContext, settings: list[tuple[TrainSpec, Policy]], pool, workers: int,
           progress) -> tuple[list[Candidate], int]:
    """Every candidate in waves of micro-batch, smallest first: the settings that overflowed
    the GPU at one are not tried at a larger one. (The allocator model's fragmentation could
    in principle let a larger one fit by a sliver: not worth its cost.)"""
    c = context
    options = c.sweep_options()
    jobs = [(c.model, train, policy, c.profile, options) for train, policy in settings]
    results: list[Candidate] = []
    overflowed: set[tuple] = set()
    pruned = 0
    for micro_batch in sorted({job[1].micro_batch for job in jobs}):
        wave = [job for job in jobs if job[1].micro_batch == micro_batch]
        kept = [job for job in wave if without_micro_batch(job[1], job[2]) not in overflowed]
        pruned += len(wave) - len(kept)
        done = (pool.map(_evaluate_args, kept, chunksize=max(1, len(kept) // (4 * workers)))
                if pool is not None else map(_evaluate_args, kept))
        for job, candidate in zip(kept, done, strict=True):
            results.append(candidate)
            if any(o.tier == "gpu" for o in candidate.prediction.overflows):
                overflowed.add(without_micro_batch(job[1], job[2]))
            if progress:
                progress(len(results) + pruned, len(jobs))
    return results, pruned


def _filled(context: TuneContext, order: list[Candidate], pool) -> list[Candidate]:
    """The FILL_FINALISTS fastest with the GPU memory they leave free filled."""
    c = context
    leaders = [x for x in order if x.feasible][:FILL_FINALISTS]
    options = {"gpu_memory_bytes": c.gpu_memory_bytes, "num_steps": c.num_steps,
               "settle_clock": not c.settle_late}
    jobs = [(c.model, x, c.profile, options) for x in leaders]
    filled = list(pool.map(_fill_args, jobs) if pool is not None and len(leaders) > 1
                  else map(_fill_args, jobs))
    return _with_leaders(filled, leaders, order)


def _settled(context: TuneContext, order: list[Candidate]) -> list[Candidate]:
    """The CLOCK_FINALISTS fastest again, each at the speed its GPU settles at; settling can
    also slow a leader (a table below 1 when busy): until the first is a settled one, settle
    whichever leads."""
    c = context
    done: list[Candidate] = []

    def settle(candidate: Candidate) -> Candidate:
        done.append(settled(c.model, candidate, c.profile, c.gpu_memory_bytes, c.num_steps))
        return done[-1]

    leaders = [x for x in order if x.feasible][:CLOCK_FINALISTS]
    order = _with_leaders([settle(x) for x in leaders], leaders, order)
    while order and order[0].feasible and not any(order[0] is x for x in done):
        order = ranked([settle(order[0]), *order[1:]])
    return order


def _with_leaders(new: list[Candidate], leaders: list[Candidate],
                  order: list[Candidate]) -> list[Candidate]:
    """The ranking with the leaders replaced by what a stage made of them."""
    return ranked(new + [x for x in order if not any(x is y for y in leaders)])


def _evaluate_args(args: tuple) -> Candidate:
    return evaluate(*args[:4], **args[4])


def _fill_args(args: tuple) -> Candidate:
    return filled_with_gpu_updates(*args[:3], **args[3])
