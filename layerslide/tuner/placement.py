"""Where a candidate's state goes: the least NVMe use (and pinned grad landing buffers) under
which it fits the host. NVMe only ever slows a step down, so a candidate gets RAM first; while
the host overflows it first bounds the pinned gradient landing buffers, then spills moments,
then master weights, one NVMe read ahead instead of two, the activation checkpoints, and last
the bf16 weights to NVMe; where the larger of two coarse placements overflows the drive, the
least one between them that sheds the host's overflow."""

from __future__ import annotations

from dataclasses import replace

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Policy, TrainSpec, sizes
from layerslide.planner.settings import BOUNDED_LANDING_BUFFERS, grads_land_in_upload
from layerslide.simulator import CostModel
from layerslide.tuner.plans import predicted
from layerslide.tuner.space import Candidate

# (moments_on_nvme, master_on_nvme), least NVMe first (then WEIGHT_SPILLS).
NVME_PLACEMENTS = ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (1.0, 0.5), (1.0, 1.0))
SPILL_STEP = 0.05  # finer placements are rounded up to this fraction
WEIGHT_SPILLS = (0.5, 1.0)  # coarse fractions of the bf16 weights on NVMe, after all else


def placement_steps(train: TrainSpec, policy: Policy, allow_nvme: bool,
                    ) -> tuple[list[tuple], list[int | None]]:
    """place_state's coarse tries, least NVMe first: (moments, master, weights on NVMe,
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


def placed_policy(policy: Policy, moments: float, master: float, weights: float, pool,
                  prefetch: int, activations: str) -> Policy:
    """The policy with one placement of place_state's."""
    return policy.with_(moments_on_nvme=moments, master_on_nvme=master, weights_on_nvme=weights,
                        host_grad_buffers=pool, nvme_prefetch=prefetch, activations=activations)


def place_state(model: ModelSpec, train: TrainSpec, policy: Policy, profile: HardwareProfile,
                *, gpu_memory_bytes: int | None, allow_nvme: bool, num_steps: int,
                costs: CostModel, settle_clock: bool) -> Candidate:
    """The least NVMe use (and pinned grad buffers) under which the candidate fits the host;
    with all state on NVMe and the host still over, one block's state staged at a time, then
    the checkpoints, then the bf16 weights on NVMe."""
    steps, pools = placement_steps(train, policy, allow_nvme)
    master_ok, weights_ok = policy.schedule.cast == "cpu_once", policy.optimizer_casts
    coarse = {step[:3] for step in steps}

    def attempt(moments: float, master: float, weights: float, pool, prefetch: int,
                activations: str) -> Candidate:
        tried = placed_policy(policy, moments, master, weights, pool, prefetch, activations)
        prediction = predicted(model, train, tried, profile, gpu_memory_bytes=gpu_memory_bytes,
                               num_steps=num_steps, costs=costs, settle_clock=settle_clock)
        return Candidate(train=train, policy=tried, prediction=replace(prediction, trace=None))

    def finer_between(placed: tuple, prefetch: int, activations: str,
                      over: Candidate) -> Candidate | None:
        """The least spill past `placed` (where the host overflowed by `over`'s bytes) that
        fits, short of the next coarse placement; the staging buffers a spill adds take some
        of it back: again while it falls short."""
        finer, candidate = tuple(placed), over
        while True:
            finer = finer_spill(finer, host_over_bytes(candidate), model.total_params,
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


def host_over_bytes(candidate: Candidate) -> int:
    return max((o.need_bytes - o.limit_bytes for o in candidate.prediction.overflows
                if o.tier == "host"), default=0)


def finer_spill(placed: tuple[float, float, float], over_bytes: int, params: int, *,
                master_ok: bool = True, weights_ok: bool = True,
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
