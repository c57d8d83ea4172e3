"""One candidate evaluated, and what a search gives the leaders after its sweep, in order
(STAGES): the GPU memory they leave free filled with blocks updated on the GPU, (profiles with
a busy speedup) the GPU's clock settled against its busy fraction, and, GPU-bound, their CPU
kernels niced (tuner.lanes_first)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Policy, TrainSpec
from layerslide.planner.build import gpu_layout
from layerslide.planner.settings import GPU_UPDATE_ORDERS
from layerslide.simulator import CostModel
from layerslide.tuner.bounds import GPU_FILL_MARGIN, gpu_update_blocks_fitting
from layerslide.tuner.lanes_first import niced_where_gpu_bound
from layerslide.tuner.placement import place_state
from layerslide.tuner.plans import predicted, simulated
from layerslide.tuner.space import Candidate

STAGES = ("fill", "settle", "nice")


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
        costs = CostModel(profile, lanes_first=policy.executor.lanes_first, gpus=train.gpus,
                          hosts=train.hosts)
    base = place_state(model, train, policy, profile, gpu_memory_bytes=gpu_memory_bytes,
                       allow_nvme=allow_nvme, num_steps=num_steps, costs=costs,
                       settle_clock=settle_clock)
    if not (fill_gpu_updates and base.feasible):
        return base
    return filled_with_gpu_updates(model, base, profile, gpu_memory_bytes=gpu_memory_bytes,
                                   num_steps=num_steps, costs=costs, settle_clock=settle_clock)


def filled_with_gpu_updates(model: ModelSpec, base: Candidate, profile: HardwareProfile, *,
                            gpu_memory_bytes: int | None, num_steps: int,
                            costs: CostModel | None = None, settle_clock: bool = True,
                            worth_trying: Callable[[tuple[int, ...]], bool] | None = None,
                            ) -> Candidate:
    """The feasible candidate with the GPU memory it leaves free given to blocks updated on
    the GPU, where that is faster; else itself. Each try takes the first blocks of an order
    that fit, then half as many while the GPU overflows; `worth_trying(blocks)` False skips a
    try and the fewer blocks of its order after it (a best-first search whose bound says none
    of them can beat its best)."""
    costs = costs or CostModel(profile, lanes_first=base.policy.executor.lanes_first,
                               gpus=base.train.gpus, hosts=base.train.hosts)
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
            if worth_trying is not None and not worth_trying(blocks):
                break
            prediction = predicted(model, train, filled, profile,
                                   gpu_memory_bytes=gpu_memory_bytes, num_steps=num_steps,
                                   costs=costs, settle_clock=settle_clock)
            if prediction.feasible:
                if prediction.tokens_per_s > best.prediction.tokens_per_s:
                    best = Candidate(train=train, policy=filled,
                                     prediction=replace(prediction, trace=None))
                break
            count //= 2  # the estimate missed dynamic memory: try half as many
    return best


def settled(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
            gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate's own placement simulated again with the GPU's clock settled."""
    prediction = simulated(model, candidate.train, candidate.policy, profile,
                           gpu_memory_bytes=gpu_memory_bytes, num_steps=num_steps)
    return replace(candidate, prediction=replace(prediction, trace=None))


def niced(model: ModelSpec, candidate: Candidate, profile: HardwareProfile,
          gpu_memory_bytes: int | None, num_steps: int) -> Candidate:
    """The candidate with its CPU kernels niced where it is GPU-bound (tuner.lanes_first)."""
    found = niced_where_gpu_bound(
        candidate.policy, candidate.prediction, profile,
        lambda policy: simulated(model, candidate.train, policy, profile,
                                 gpu_memory_bytes=gpu_memory_bytes, num_steps=num_steps))
    if found is None:
        return candidate
    policy, prediction = found
    return replace(candidate, policy=policy, prediction=replace(prediction, trace=None))
