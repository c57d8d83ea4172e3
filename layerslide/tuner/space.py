"""What tune searches: the settings it combines (SearchSpace), and one combination evaluated
(Candidate), ranked best tokens/s first."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from layerslide.planner import Policy, TrainSpec
from layerslide.planner.settings import (
    ACCUMULATIONS,
    ACTIVATION_PLACEMENTS,
    CAST_MODES,
    MOMENT_PRECISIONS,
    OPTIMIZER_ORDERS,
)
from layerslide.simulator import Prediction
from layerslide.trace import TIERS

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

    def rank_accums(self, ranks: int) -> tuple[int, ...]:
        """Each rank's accumulations to try: grad_accums, and each divided by the ranks (so
        that N ranks are tried at the global batches one GPU is)."""
        shared = {ga // ranks for ga in self.grad_accums if ga // ranks >= 1}
        return tuple(sorted(set(self.grad_accums) | shared))

    def candidates(self, seq_len: int, max_grad_norm: float | None, base: Policy,
                   gpus: int = 1, hosts: int = 1) -> Iterable[tuple[TrainSpec, Policy]]:
        """Every combination as (TrainSpec, Policy), for `gpus` ranks per host on `hosts`
        hosts; max_tokens_per_step caps a step's tokens over every rank (the global batch)."""
        for w, mb, ga, accumulation, act, cast, worker, order, moments in itertools.product(
                self.windows, self.micro_batches, self.rank_accums(gpus * hosts),
                self.accumulations,
                self.activations, self.casts, self.cast_workers, self.optimizer_orders,
                self.moment_precisions):
            if ga == 1 and accumulation != self.accumulations[0]:
                continue  # one micro-batch a step: both schedules are the same plan
            if (accumulation == "step_major" and ga > self.step_major_max_accum
                    and "layer_major" in self.accumulations):
                continue  # layer-major is tried instead
            tokens = mb * seq_len * ga * gpus * hosts
            if self.max_tokens_per_step is not None and tokens > self.max_tokens_per_step:
                continue
            train = TrainSpec(micro_batch=mb, seq_len=seq_len, grad_accum=ga,
                              max_grad_norm=max_grad_norm, gpus=gpus, hosts=hosts)
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
            "gpus": t.gpus, "hosts": t.hosts,
            "tokens_per_step": t.global_tokens_per_step,  # every rank's
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


def ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Feasible first, fastest first; ties keep their order."""
    return sorted(candidates, key=lambda c: (not c.feasible, -(c.prediction.tokens_per_s or 0.0)))
