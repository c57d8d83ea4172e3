"""tune's default search, best first. Each candidate goes through levels (tuner.levels), each
giving a tighter upper bound on its tokens/s: its class plans' (all at once, first), a short
plan's, its sweep simulation (with a bound on what the later stages can add), and last its
fill, settled clock and niceness: its final tokens/s. The candidate with the highest bound
goes a level on, on each of `workers` processes, until no bound beats the best final tokens/s
found (by more than `tolerance` of it): the best is then the exhaustive search's pick, since
every candidate that could beat it got the stages that search gives its leaders. Settings whose
smaller micro-batch overflowed the GPU are not tried, as in the exhaustive sweep."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass

from layerslide.planner import Policy, TrainSpec
from layerslide.tuner.context import TuneContext, without_micro_batch
from layerslide.tuner.levels import levels_for, run_level, worker_start
from layerslide.tuner.space import Candidate, ranked
from layerslide.tuner.stages import STAGES

SWEEP = 2  # the level of the sweep simulation: below it, bounds only


@dataclass(frozen=True)
class Outcome:
    """What the search found: the candidates simulated (ranked), how many were skipped (a
    smaller micro-batch overflowed the GPU) or bounded away, and whether Ctrl-C stopped it."""

    ranked: list[Candidate]
    pruned: int
    bounded: int
    interrupted: bool


class _Done:
    """A result already there (the search without a pool works as if through one)."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class BestFirst:
    """One best-first search; run() once."""

    def __init__(self, context: TuneContext, settings: list[tuple[TrainSpec, Policy]],
                 workers: int, progress: Callable[[int, int], None] | None, tolerance: float,
                 interruptible: bool = True):
        self.context, self.settings = context, settings
        self.levels = levels_for(context)
        self.workers, self.progress, self.tolerance = max(1, workers), progress, tolerance
        self.interruptible = interruptible
        self.heap: list[tuple[float, int, int]] = []  # (-bound, candidate, level)
        self.inflight: dict = {}  # future -> (candidate, level, bound)
        self.latest: dict[int, Candidate] = {}  # each simulated candidate's latest
        self.stages_done: dict[int, int] = {}  # how many of STAGES each has been through
        self.sweep_tps: dict[int, float] = {}  # what the sweep said of each (ties: the faster)
        self.finished: set[int] = set()
        self.best: int | None = None
        self.overflowed: dict[tuple, int] = {}  # settings -> smallest micro-batch over the GPU
        self.dive: list[tuple] = []  # the candidate taken on to its end before any other
        self.pruned = 0

    def threshold(self) -> float:
        """The tokens/s a bound must beat to be worth going on with."""
        if self.best is None:
            return -1.0
        return self.latest[self.best].prediction.tokens_per_s * (1 + self.tolerance)

    def run(self) -> Outcome:
        self.heap = [(-self.levels.class_tokens_per_s(train, policy), i, 0)
                     for i, (train, policy) in enumerate(self.settings)]
        heapq.heapify(self.heap)
        pool = (ProcessPoolExecutor(max_workers=self.workers, initializer=worker_start,
                                    initargs=(self.context,))
                if self.workers > 1 and len(self.heap) > 1 else None)
        interrupted = False
        try:
            while self._submit(pool):
                done = (wait(self.inflight, return_when=FIRST_COMPLETED)[0] if pool is not None
                        else list(self.inflight))
                for future in done:
                    i, level, bound = self.inflight.pop(future)
                    self._handle(i, level, bound, future.result())
                self._report()
        except KeyboardInterrupt:
            if not self.interruptible:
                raise
            interrupted = True
        finally:
            if pool is not None:
                _stop(pool, interrupted)
        if not interrupted:
            self._finish_ahead_of_best()
            self._report()
        return Outcome(ranked=self._ranking(interrupted), pruned=self.pruned,
                       bounded=len(self.settings) - len(self.latest) - self.pruned,
                       interrupted=interrupted)

    def _submit(self, pool) -> bool:
        """Take candidates a level on until every worker is busy: until a candidate has been
        finished, the one simulated first goes on (a best to prune with, early); then the
        highest bound, while it beats the best. False once nothing is left to do."""
        threshold = self.threshold()
        while len(self.inflight) < self.workers and (
                self.dive or (self.heap and -self.heap[0][0] > threshold)):
            neg, i, level = self.dive.pop() if self.dive else heapq.heappop(self.heap)
            if level < SWEEP and self._skipped(i):
                self.pruned += 1
                continue
            if level < SWEEP and self.context.settle_late and self.best is not None:
                # were it to beat the best, its clock could settle only so fast
                refined = self.levels.bound_if_beating(*self.settings[i], threshold)
                if refined < -neg:
                    if refined > threshold:
                        heapq.heappush(self.heap, (-refined, i, level))
                    continue
            name, *args = self._work(level, i)
            future = (pool.submit(run_level, name, *args) if pool is not None
                      else _Done(getattr(self.levels, name)(*args)))
            self.inflight[future] = (i, level, -neg)
        return bool(self.inflight)

    def _work(self, level: int, i: int) -> tuple:
        """The Levels method and arguments that take candidate i past `level`."""
        if level == 0:
            return ("short_bound", *self.settings[i])
        if level == 1:
            return ("sweep", *self.settings[i])
        return ("stage", self.latest[i], STAGES[level - SWEEP], self.threshold())

    def _skipped(self, i: int) -> bool:
        train, policy = self.settings[i]
        smallest = self.overflowed.get(without_micro_batch(train, policy))
        return smallest is not None and smallest < train.micro_batch

    def _handle(self, i: int, level: int, bound: float, result) -> None:
        if level == 0:  # a short plan's bound, or the candidate rejected on the GPU
            tighter, rejected = result
            if rejected is not None:
                self._sweep_done(i, rejected)
            else:
                heapq.heappush(self.heap, (-min(bound, tighter), i, 1))
            return
        candidate, later = result
        if level == 1:  # the sweep's simulation
            self._sweep_done(i, candidate)
            if not candidate.feasible:
                return
        else:
            self.latest[i] = candidate
        self.stages_done[i] = level - 1
        if later is None:  # nothing left can move it: finished (its niceness, cheaply)
            self._finished_with(i, self.levels.finish(candidate, STAGES[level - 1:]))
        elif self.best is None and not self.dive:
            self.dive.append((-min(bound, later), i, level + 1))
        else:
            heapq.heappush(self.heap, (-min(bound, later), i, level + 1))

    def _sweep_done(self, i: int, candidate: Candidate) -> None:
        self.latest[i] = candidate
        self.sweep_tps[i] = candidate.prediction.tokens_per_s or 0.0
        if any(o.tier == "gpu" for o in candidate.prediction.overflows):
            key = without_micro_batch(*self.settings[i])
            mb = candidate.train.micro_batch
            self.overflowed[key] = min(self.overflowed.get(key, mb), mb)

    def _finished_with(self, i: int, candidate: Candidate) -> None:
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

    def _finish_ahead_of_best(self) -> None:
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
                self._finished_with(i, self.levels.finish(self.latest[i], STAGES[done:]))

    def _ranking(self, interrupted: bool) -> list[Candidate]:
        """The candidates simulated, best first: in the settings' order, ties rank as in the
        sweep; the best finished first (an unfinished one ahead of it only ties it)."""
        order = ranked([self.latest[i] for i in sorted(self.latest)])
        if self.best is None or interrupted:
            return order
        best = self.latest[self.best]
        return [best, *(c for c in order if c is not best)]

    def _report(self) -> None:
        """Progress: the candidates settled (simulated to their end, or ruled out by their
        bound or a smaller micro-batch) of the space."""
        if not self.progress:
            return
        threshold = self.threshold()
        open_ = (sum(1 for neg, _, _ in self.heap if -neg > threshold)
                 + len(self.inflight) + len(self.dive))
        total = len(self.settings)
        self.progress(total - open_, total)


def _stop(pool: ProcessPoolExecutor, now: bool) -> None:
    """Shut the pool down; on Ctrl-C without waiting for the candidates in flight."""
    if not now:
        pool.shutdown()
        return
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
