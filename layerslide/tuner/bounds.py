"""Upper bounds on the tokens/s a tune candidate can reach, before simulating it or before its
GPU-update fill, clock and niceness are tried: what lets the best-first search
(tuner.best_first) simulate only the candidates that can still beat the best it has.

A step is no shorter than its floors (simulator.predict.step_floors: each lane's work alone,
each shared resource's use over its capacity), so tokens per step over the largest floor bounds
a candidate's tokens/s. The floors are sums over a step's tasks, block by block, and a model's
decoder layers repeat: a plan of a few layers (and of two steps, not three) gives every floor of
the deep one, its extra layers counted at the least any layer of the short plan takes. Cheaper
still, a plan of one layer and one micro-batch (a "class" shared by every window, activation
placement, accumulation and NVMe placement) gives the GPU's work per micro-batch and the CPU's
per step, which bound every candidate of the class.

What the later stages can lower is taken out: the fill's GPU-updated blocks take their work off
every lane but the GPU's (a block's whole share of each other floor, the largest blocks the GPU
could take), and off the GPU's all but their compute (where a fill may come, the GPU's floors
are the class plans' compute alone, without GPU casts); a settled clock runs the GPU's compute up to the profile's largest busy speedup
(the bounds cost the GPU at that speed). A niced plan's floors are its un-niced ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from layerslide.hwprofiles import HardwareProfile
from layerslide.kinds import COMPUTE_KINDS
from layerslide.planner import ModelSpec, Policy, TrainSpec, sizes
from layerslide.planner.build import gpu_update_candidates
from layerslide.planner.plan import EMBEDDING, Plan
from layerslide.planner.settings import GPU_UPDATE_ORDERS
from layerslide.simulator import CostModel
from layerslide.simulator.predict import floors_by_block

# A bound is raised by this much before it prunes: a floor sums the same costs the simulation
# spends, but in another order (float round-off), and the steady step is read off two cycles.
SLACK = 1.001
# the GPU's floors: a fill adds GPU-updated blocks' optimizer steps to them, and takes their
# casts and grad copies off (only their compute stays: see plan_bounds)
GPU_SIDE = ("lane:gpu", "dispatch:gpu")
# the class plan's floors that bound a step: the GPU's per micro-batch, the CPU's per step
CLASS_PER_MICRO_BATCH = GPU_SIDE
CLASS_PER_STEP = ("lane:cpu", "lane:cpu_cast")
# decoder layers a short plan has beyond its window (and dedicated layers): enough for one
# layer to load, compute and offload as every middle layer of the deep plan does
SHORT_PLAN_EXTRA_LAYERS = 3
GPU_FILL_MARGIN = 0.95  # of the free GPU memory, what a GPU-update fill may take (stages)


def max_gpu_speedup(profile: HardwareProfile) -> float:
    """The most a settled clock can speed the GPU's compute up (1 without a busy table)."""
    points = profile.gpu.busy_speedup
    return max(1.0, *(s for _, s in points)) if points else 1.0


# a settled clock is taken this much above where the bound on it says (the settling stops
# within simulator.predict's CLOCK_TOLERANCE of its fixed point)
SPEEDUP_SLACK = 1.01


def settled_speedup_bound(profile: HardwareProfile, gpu_work_s: float, step_s: float) -> float:
    """The fastest the GPU's clock can settle at for a step of at most step_s whose GPU work
    at speed 1 is at least gpu_work_s: at speed s it is busy at least gpu_work_s / s over the
    step, so at most the busy table's largest speedup from that fraction up (linear between
    points), and the bound is tightened until it holds. A table below 1 anywhere, or no step:
    the largest speedup."""
    table = profile.gpu.busy_speedup
    top = max_gpu_speedup(profile)
    if table is None or any(x < 1 for _, x in table) or step_s <= 0:
        return top
    speedup = top
    for _ in range(50):
        busy = min(1.0, gpu_work_s / (speedup * step_s))
        tighter = max([profile.gpu.speedup_at_busy(busy), profile.gpu.speedup_at_busy(1.0),
                       *(x for b, x in table if b >= busy)])
        if tighter >= speedup - 1e-6:
            break
        speedup = tighter
    return min(top, speedup * SPEEDUP_SLACK)


def gpu_update_blocks_fitting(model: ModelSpec, headroom_bytes: float, order: str,
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


def fill_takes(model: ModelSpec, policy: Policy, headroom_bytes: float,
               ) -> list[list[int]] | None:
    """The blocks a GPU-update fill could take off the host in each order (the first ones of
    its sequence that fit the headroom), or None where it would try none."""
    precision = policy.residency.moment_precision
    taken = []
    for order in GPU_UPDATE_ORDERS:
        count = gpu_update_blocks_fitting(model, headroom_bytes, order, precision)
        if count > policy.residency.gpu_updated_blocks:
            taken.append(gpu_update_candidates(model.num_layers, order)[:count])
    return taken or None


@dataclass(frozen=True, kw_only=True)
class BlockFloors:
    """A plan's floor terms by block, and how to read them for a model of `num_layers`: its own
    layers' terms as they are, each layer more at the least any of them takes (a short plan of
    a deeper model)."""

    embedding: dict[str, float]
    head: dict[str, float]
    layers: tuple[dict[str, float], ...]
    num_layers: int  # of the model bounded (>= len(layers))

    @classmethod
    def of(cls, plan: Plan, costs: CostModel, num_layers: int,
           kinds: tuple[str, ...] | None = None) -> BlockFloors:
        by_block = floors_by_block(plan, costs, kinds)
        short = plan.model.num_layers
        return cls(embedding=by_block.get(EMBEDDING, {}), head=by_block.get(short, {}),
                   layers=tuple(by_block.get(i, {}) for i in range(short)),
                   num_layers=num_layers)

    def keys(self) -> set[str]:
        return {k for terms in (self.embedding, self.head, *self.layers) for k in terms}

    def total(self, key: str) -> float:
        values = [layer.get(key, 0.0) for layer in self.layers]
        extra = self.num_layers - len(values)
        return (self.embedding.get(key, 0.0) + self.head.get(key, 0.0) + sum(values)
                + (extra * min(values) if extra and values else 0.0))

    def block(self, block: int, key: str) -> float:
        """The most the block can take of the key (a layer beyond the short plan's: the most
        any of its layers takes)."""
        if block == EMBEDDING:
            return self.embedding.get(key, 0.0)
        if block == self.num_layers:
            return self.head.get(key, 0.0)
        if block < len(self.layers) and len(self.layers) == self.num_layers:
            return self.layers[block].get(key, 0.0)
        return max((layer.get(key, 0.0) for layer in self.layers), default=0.0)

    def bounds(self, fill: list[list[int]] | None) -> dict[str, float]:
        """Lower bounds on each floor of the candidate, and of what a fill taking one of
        `fill`'s block lists makes of it (the GPU side aside: see bounds())."""
        out = {}
        for key in self.keys():
            value = self.total(key)
            if fill and key not in GPU_SIDE:
                value -= max(sum(self.block(b, key) for b in blocks) for blocks in fill)
            out[key] = max(value, 0.0)
        return out


def tokens_per_s_bound(tokens_per_step: int, floors: dict[str, float]) -> float:
    """Tokens/s no schedule of these floors beats (with SLACK); inf without any floor."""
    floor = max(floors.values(), default=0.0)
    return tokens_per_step / floor * SLACK if floor > 0 else float("inf")


def class_key(train: TrainSpec, policy: Policy) -> tuple:
    """What a class plan is built from: the candidate without the settings that change no
    GPU work per micro-batch and no CPU work per step, and without blocks kept on the GPU (what
    they compute is the same; class_bounds leaves the CPU's floors out for such a candidate)."""
    plain = policy.with_(window=1, activations="gpu", accumulation="step_major",
                         moments_on_nvme=0.0, master_on_nvme=0.0, weights_on_nvme=0.0,
                         host_grad_buffers=None, nvme_prefetch=1, prefetch_depth=1,
                         gpu_updated_blocks=0, resident_layers=0)
    return (train.micro_batch, train.seq_len, train.max_grad_norm, train.gpus, train.hosts,
            plain)


def keeps_blocks_on_gpu(policy: Policy) -> bool:
    """Resident layers or GPU-updated blocks: its class plan charges their work to the CPU."""
    return bool(policy.residency.gpu_updated_blocks or policy.residency.resident_layers)


def class_plan_settings(model: ModelSpec, key: tuple) -> tuple[ModelSpec, TrainSpec, Policy]:
    """What a key's class plan is built from: one decoder layer, one micro-batch a step."""
    micro_batch, seq_len, max_grad_norm, gpus, hosts, policy = key
    return (dataclasses.replace(model, num_layers=1),
            TrainSpec(micro_batch=micro_batch, seq_len=seq_len, max_grad_norm=max_grad_norm,
                      gpus=gpus, hosts=hosts),
            policy)


def class_floors(plan: Plan, costs: CostModel, num_layers: int,
                 ) -> tuple[BlockFloors, BlockFloors]:
    """The floor terms of a class plan (class_plan_settings) for a model of num_layers: of
    all its tasks, and of its compute tasks alone (what every micro-batch of every candidate of
    the class computes however its step is laid out, and a GPU-updated block too)."""
    return (BlockFloors.of(plan, costs, num_layers),
            BlockFloors.of(plan, costs, num_layers, kinds=COMPUTE_KINDS))


def class_bounds(floors: BlockFloors, compute: BlockFloors, grad_accum: int,
                 fill: list[list[int]] | None, cpu: bool = True) -> dict[str, float]:
    """Bounds on a candidate's floors from its class plans: the GPU's compute per micro-batch
    (`compute`: of the class without GPU casts where the candidate casts there, as a fill may
    drop them) times the step's micro-batches, and (cpu) the CPU's per step less what a fill
    may take."""
    out = {key: grad_accum * compute.total(key) for key in CLASS_PER_MICRO_BATCH}
    if not cpu:
        return out
    per_step = floors.bounds(fill)
    out.update({key: per_step[key] for key in CLASS_PER_STEP if key in per_step})
    return out


def short_plan_model(model: ModelSpec, policy: Policy) -> tuple[ModelSpec, bool]:
    """The model a candidate's short plan is built for: as few layers as bound the deep one's
    floors (its window, the blocks it keeps on the GPU and SHORT_PLAN_EXTRA_LAYERS), and
    whether that is the whole model."""
    res = policy.residency
    layers = res.window + res.resident_layers + res.gpu_updated_blocks + SHORT_PLAN_EXTRA_LAYERS
    if layers >= model.num_layers:
        return model, True
    return dataclasses.replace(model, num_layers=layers), False


def plan_bounds(floors: BlockFloors, fill: list[list[int]] | None, compute: BlockFloors,
                grad_accum: int) -> dict[str, float]:
    """Bounds on a candidate's floors from a plan of it (short or whole). Where a fill may
    take blocks, a block it takes keeps on the GPU only its compute (`compute`: the class
    plan's without GPU casts, per micro-batch, times grad_accum): it drops the GPU work its
    loads and offloads brought, its casts and grad sums; it adds its optimizer step."""
    out = floors.bounds(fill)
    if fill:
        for key in GPU_SIDE:
            dropped = max(sum(max(0.0, floors.block(b, key) - grad_accum * compute.block(b, key))
                              for b in blocks) for blocks in fill)
            out[key] = max(floors.total(key) - dropped, grad_accum * compute.total(key), 0.0)
    return out


# A short plan's GPU bound stands for the deep plan's only this far beyond the limit: the deep
# plan holds what the short one does at once and more (every layer's checkpoints, where they
# stay on the GPU), but its allocator model may pack it a little otherwise.
SHORT_PLAN_GPU_MARGIN = 0.05
# decoder layers a second short plan has beyond the first: what each layer more holds on the
# GPU where the checkpoints stay there (tuner.levels extrapolates the deep plan's with it)
DEPTH_PROBE_LAYERS = 2


def gpu_in_use_lower_bound(plan: Plan) -> int:
    """Bytes the plan holds on the GPU at once in any run of it: at the start of each task of
    the GPU lane (a stream: its tasks run in order), every buffer made by an earlier GPU task
    (by it, unless as it ends), or before the plan runs, or by a task of another lane that it
    or an earlier GPU task releasing the buffer waits for (a fetched checkpoint at its
    backward), and released by it or a later GPU task (or never); the largest such sum. The
    simulated peak is at least this."""
    order = plan.lane_order.get("gpu", ())
    position = {tid: i for i, tid in enumerate(order)}
    graph = plan.graph
    last = len(order) - 1
    change = [0] * (len(order) + 1)
    for b in plan.buffers:
        if b.tier != "gpu":
            continue
        ends = [position[t] for t in b.release_tasks if t in position]
        if b.release_tasks and not ends:
            continue  # freed by another lane's tasks: when is not known here
        end = max(ends) if ends else last
        if b.alloc_task is None:
            start = 0
        elif b.alloc_task in position:
            start = position[b.alloc_task] + (1 if b.at_end else 0)
        else:  # made on another lane: there by the time a GPU task waiting for it starts
            waiting = [position[t] for t in b.release_tasks
                       if t in position and graph.has_edge(b.alloc_task, t)]
            if not waiting:
                continue
            start = min(waiting)
        if start <= end:
            change[start] += b.bytes
            change[end + 1] -= b.bytes
    peak = held = 0
    for delta in change[:-1]:
        held += delta
        peak = max(peak, held)
    return peak
