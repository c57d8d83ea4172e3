"""Prediction: what a plan does on a profile. Step time, throughput, memory peaks, bottleneck;
or why it does not fit."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner.plan import STEADY_STEPS, Buffer, Plan, runtime_buffer_id
from layerslide.simulator.bounds import bound_of
from layerslide.simulator.costmodel import HOST_CORES, CostModel, shape_of
from layerslide.simulator.engine import simulate_run
from layerslide.simulator.ranks import check_ranks
from layerslide.trace import TIERS, Trace

GIB = 1024**3
# Rounds of settling the GPU's clock against its busy fraction, and the speedup change that
# ends them early (profiles without GPUSpec.busy_speedup take none).
CLOCK_ROUNDS = 4
CLOCK_TOLERANCE = 0.005


@dataclass(frozen=True, kw_only=True)
class Overflow:
    """A tier whose need exceeds its limit."""

    tier: str
    need_bytes: int
    limit_bytes: int
    reserve_bytes: int = 0  # what the limit leaves the rest of the machine (the host's)
    ranks: int = 1  # the host's ranks whose needs add up to need_bytes (host and NVMe tiers)

    def __str__(self) -> str:
        reserve = (f" (RAM less {self.reserve_bytes / GIB:.0f} GiB for the OS and the CUDA "
                   "driver)" if self.reserve_bytes else "")
        each = (f" ({self.ranks} ranks x {self.need_bytes / self.ranks / GIB:.1f} GiB)"
                if self.ranks > 1 else "")
        return (f"{self.tier} needs {self.need_bytes / GIB:.1f} GiB{each} "
                f"> limit {self.limit_bytes / GIB:.1f} GiB{reserve}")


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Simulated outcome of a plan. When infeasible, `overflows` says which tier and by how much;
    timing fields are None if the plan was rejected before simulating. With several ranks it is
    one rank's (its peaks, lanes and floors) on its share of the host, but for the step's tokens
    and throughput, which are every rank's, and the limits, which are the host's (its RAM and
    drives) and each GPU's."""

    label: str
    tokens_per_step: int  # every rank's tokens of a step (TrainSpec.global_tokens_per_step)
    limits_bytes: dict[str, int]
    peak_bytes: dict[str, int]
    overflows: tuple[Overflow, ...] = ()
    step_s: float | None = None
    tokens_per_s: float | None = None
    model_flops_per_s: float | None = None
    mfu: float | None = None
    lane_busy: dict[str, float] = field(default_factory=dict)
    bottleneck: str | None = None
    # Lower bounds on the step: each lane's work run alone, each shared resource's total use
    # over its capacity. The largest is the floor no schedule of this plan can beat.
    floors_s: dict[str, float] = field(default_factory=dict)
    trace: Trace | None = None
    # the part of the GPU peak that is not allocations: the CUDA context, cuDNN's workspaces and
    # allocator slack (Plan.runtime_bytes("gpu"))
    gpu_runtime_bytes: int = 0
    # the GPU peak as torch.cuda.max_memory_allocated counts it (simulator.memory's held
    # counter: a block counts until its last user is enqueued); 0 for a plan not simulated
    gpu_held_peak_bytes: int = 0
    # Peak GPU bytes per allocation pool: the lane whose task allocates a buffer, "static" for
    # those allocated before the plan runs (runtime included). See simulator.memory.
    gpu_pool_peak_bytes: dict[str, int] = field(default_factory=dict)
    # GPU bytes the caching allocator reserves per pool, from its model (simulator.allocator);
    # the runtime's bytes are not in it
    gpu_pool_reserved_bytes: dict[str, int] = field(default_factory=dict)
    # how much faster than the profile's efficiency tables the GPU computed (GPUSpec.busy_speedup
    # at the busy fraction the simulation settled on; 1 without a table)
    gpu_speedup: float = 1.0
    ranks_per_host: int = 1  # the plan's GPUs per host (Placement.gpus), one rank each
    hosts: int = 1

    @property
    def ranks(self) -> int:
        return self.ranks_per_host * self.hosts

    @property
    def peak_bytes_per_host(self) -> dict[str, int]:
        """Each tier's peak over a host's ranks together (the GPU tier: all its GPUs')."""
        return {t: b * self.ranks_per_host for t, b in self.peak_bytes.items()}

    @property
    def bound(self) -> str | None:
        """The resource whose floor is the largest share of the step (bounds.bound_of)."""
        return bound_of(self.floors_s, self.step_s)[0]

    @property
    def bound_share(self) -> float | None:
        """That floor over the step: near 1, the step runs as fast as its bound allows."""
        return bound_of(self.floors_s, self.step_s)[1]

    @property
    def gpu_allocated_peak_bytes(self) -> int:
        """The GPU peak as the framework's allocator counts it (torch.cuda.max_memory_allocated):
        the plan's buffers without the runtime estimate, each from its request until the host
        drops it (the GPU work on it may still run: what must fit is gpu_need_bytes)."""
        if self.gpu_held_peak_bytes:
            return self.gpu_held_peak_bytes
        return self.peak_bytes["gpu"] - self.gpu_runtime_bytes

    @property
    def gpu_reserved_bytes(self) -> int:
        """The GPU reserve as the framework's allocator counts it (torch.cuda.max_memory_reserved):
        the pools' reserves from the allocator's model; the allocated peak where none was
        modelled (a plan rejected before simulating)."""
        if not self.gpu_pool_reserved_bytes:
            return self.gpu_allocated_peak_bytes
        return sum(self.gpu_pool_reserved_bytes.values())

    @property
    def gpu_need_bytes(self) -> int:
        """What must fit the GPU (see gpu_need_bytes)."""
        return gpu_need_bytes(self.peak_bytes["gpu"], self.gpu_pool_reserved_bytes,
                              self.gpu_runtime_bytes)

    @property
    def simulated(self) -> bool:
        """False for a plan rejected before simulating (its static buffers overflow)."""
        return self.step_s is not None

    @property
    def floor_s(self) -> float | None:
        return max(self.floors_s.values()) if self.floors_s else None

    @property
    def feasible(self) -> bool:
        return not self.overflows

    @property
    def reason(self) -> str:
        return "; ".join(str(o) for o in self.overflows)

    def summary(self) -> dict:
        """Flat JSON-friendly fields (SI units), without the trace."""
        return {
            "label": self.label,
            "feasible": self.feasible,
            "reason": self.reason,
            "step_s": self.step_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_s": self.model_flops_per_s,
            "mfu": self.mfu,
            "bottleneck": self.bottleneck,
            "lane_busy": self.lane_busy,
            "floors_s": self.floors_s,
            "floor_s": self.floor_s,
            **{f"peak_{t}_bytes": self.peak_bytes.get(t, 0) for t in TIERS},
            **{f"limit_{t}_bytes": self.limits_bytes[t] for t in TIERS},
            # as torch.cuda.max_memory_allocated counts it: the plan's buffers, no runtime
            "gpu_allocated_peak_bytes": self.gpu_allocated_peak_bytes,
            "gpu_runtime_bytes": self.gpu_runtime_bytes,
            "gpu_reserved_bytes": self.gpu_reserved_bytes if self.simulated else None,
            "gpu_need_bytes": self.gpu_need_bytes if self.simulated else None,
            "ranks_per_host": self.ranks_per_host, "hosts": self.hosts,
            **{f"peak_{t}_bytes_per_host": b for t, b in self.peak_bytes_per_host.items()},
            "bound": self.bound, "bound_share_of_step": self.bound_share,
        }


def gpu_need_bytes(peak: int, pool_reserves: dict[str, int], runtime: int) -> int:
    """What must fit the GPU: the runtime and what the allocator reserves, each stream's pool
    with the holes its order of requests leaves (so at least each pool at its own peak); the
    tier's peak where nothing was modelled. Under a cap the allocator would hand cached blocks
    on only by freeing and remapping them, which made 3B micro-batch 32 11-12% slower
    (benchmarks/results/archive/validation_2026-11-30c, -cap)."""
    return max(peak, sum(pool_reserves.values()) + runtime)


def memory_limits(profile: HardwareProfile, gpu_memory_bytes: int | None = None) -> dict[str, int]:
    """Per-tier limits: the profile's sizes (RAM less its reserve), the GPU capped at
    gpu_memory_bytes if given."""
    gpu = profile.gpu.memory_bytes
    if gpu_memory_bytes is not None:
        gpu = min(gpu, gpu_memory_bytes)
    return {"gpu": gpu, "host": profile.host.usable_ram_bytes,
            "nvme": profile.storage.total_capacity_bytes}


def static_rejection(buffers: Iterable[Buffer], tokens_per_step: int, profile: HardwareProfile,
                     *, gpu_memory_bytes: int | None = None, label: str = "",
                     ranks_per_host: int = 1, hosts: int = 1) -> Prediction | None:
    """The Prediction of a plan whose static buffers (`buffers`: its own, or
    planner.build.static_buffers' without building it; one rank's of `ranks_per_host`)
    already overflow a tier; None if they fit."""
    buffers = [b for b in buffers if b.is_static]
    limits = memory_limits(profile, gpu_memory_bytes)
    static = {t: sum(b.bytes for b in buffers if b.tier == t) for t in TIERS}
    early = _overflows(static, limits, profile, ranks_per_host)
    if not early:
        return None
    runtime = sum(b.bytes for b in buffers if b.id == runtime_buffer_id("gpu"))
    return Prediction(label=label, tokens_per_step=tokens_per_step, limits_bytes=limits,
                      peak_bytes=static, overflows=early, gpu_runtime_bytes=runtime,
                      ranks_per_host=ranks_per_host, hosts=hosts)


# tiers a host's ranks share: their needs add up against the host's limit
HOST_SHARED_TIERS = ("host", "nvme")


def _overflows(need: dict[str, int], limits: dict[str, int], profile: HardwareProfile,
               ranks_per_host: int = 1) -> tuple[Overflow, ...]:
    """The tiers a rank's `need` overflows: each GPU alone, the host's RAM and drives with the
    host's every rank's need together."""
    out = []
    for t in TIERS:
        ranks = ranks_per_host if t in HOST_SHARED_TIERS else 1
        if need[t] * ranks > limits[t]:
            out.append(Overflow(tier=t, need_bytes=need[t] * ranks, limit_bytes=limits[t],
                                reserve_bytes=profile.host.reserve_bytes if t == "host" else 0,
                                ranks=ranks))
    return tuple(out)


def _busy_fractions(spans: dict[str, list[tuple[float, float]]], start_s: float,
                    end_s: float) -> dict[str, float]:
    """Each lane's busy fraction of [start_s, end_s], from its spans in the order they ran
    (engine.SimulatedRun: one at a time, so in order of start)."""
    span = end_s - start_s
    if span <= 0:
        return {}
    busy = {}
    for lane, runs in spans.items():
        total = 0.0
        for start, end in runs:
            if start >= end_s:
                break
            overlap = min(end, end_s) - max(start, start_s)
            if overlap > 0:
                total += overlap
        busy[lane] = total / span
    return busy


def gpu_compute_busy(gpu_tasks, costs: CostModel, step_s: float) -> float:
    """The fraction of a step the GPU computes: its tasks' work alone over the step. Waiting
    for dispatches or inputs is idle time for the GPU's clocks."""
    return min(1.0, sum(costs.cost(t).solo_s for t in gpu_tasks) / step_s) if step_s > 0 else 0.0


def _step_at(seen: list[tuple[float, float]]):
    """The step time as a function of the GPU's speedup, from (speedup, step) simulated: the
    last one held, or a + b / speedup through the last two (b: the GPU work on the path)."""
    s1, t1 = seen[-1]
    s0, t0 = seen[-2] if len(seen) > 1 else seen[-1]
    if abs(1 / s0 - 1 / s1) < 1e-9:
        return lambda speedup: t1
    b = max(0.0, (t0 - t1) / (1 / s0 - 1 / s1))
    a = t1 - b / s1
    return lambda speedup: max(a + b / speedup, t1 * 1e-3)


def _clock_fixed_point(profile: HardwareProfile, gpu_tasks, step_at, start: float) -> float:
    """The GPU speedup the table gives back for the busy fraction it makes, the step following
    step_at: iterated from `start`, halfway each time (the step may answer in either sense)."""
    speedup = start
    for _ in range(60):
        costs = CostModel(profile, gpu_speedup=speedup)  # GPU busy time: no dispatch priced
        after = profile.gpu.speedup_at_busy(
            gpu_compute_busy(gpu_tasks, costs, step_at(speedup)))
        if abs(after - speedup) < CLOCK_TOLERANCE / 10:
            return after
        speedup = (speedup + after) / 2
    return speedup


def _steady_step(plan: Plan, costs: CostModel, *, label: str, profile_name: str,
                 keep_memory: bool = True) -> tuple[Trace, float, dict[str, float], dict]:
    """Simulate the plan: its trace (its events and memory samples where kept), steady step
    time, lane busy fractions in that step and each tier's peak bytes."""
    run = simulate_run(plan, costs, keep_memory, keep_events=keep_memory)
    meta = dict(run.trace.meta)
    peaks = meta.pop("peak_bytes")
    trace = Trace(source="simulated", label=label, events=run.trace.events,
                  memory=run.trace.memory, meta={**meta, "profile": profile_name})
    # Steady state: the last whole cycle, from the end of one step's last GPU task to the next;
    # or the mean cycle, if longer. Where landing-buffer backpressure holds the backward back,
    # the CPU's updates can fall one and a half steps into one cycle and half a step into the
    # next, so the last cycle alone can be shorter than the CPU's work per step.
    markers = run.marker_ends_s
    last, mean = markers[-1] - markers[-2], (markers[-1] - markers[0]) / (len(markers) - 1)
    # lane busy fractions over the same window the step time comes from
    busy = _busy_fractions(run.spans, markers[-2] if last >= mean else markers[0], markers[-1])
    return trace, max(last, mean), busy, peaks


def plan_signature(plan: Plan) -> tuple:
    """Everything of a plan its simulation reads (lane orders and disciplines, each task's
    cost-bearing fields, the edges in their order, the buffers, the step markers, the streams'
    run-ahead): two plans with one signature simulate alike, whatever policies made them (a
    window wider than the layers it slides over, casts of weights no block loads)."""
    # the graph's adjacency dicts and node data, not their views (a tune signs every plan)
    nodes, succ, pred = plan.graph._node, plan.graph._succ, plan.graph._pred
    lanes = tuple((lane, plan.lane_discipline[lane],
                   tuple((tid, shape_of(nodes[tid]["task"])) for tid in order))
                  for lane, order in plan.lane_order.items())
    edges = tuple((tid, tuple(succ[tid]), tuple(pred[tid])) for tid in nodes)
    buffers = tuple((b.id, b.tier, b.bytes, b.alloc_task, b.release_tasks, b.at_end,
                     b.outlives_outputs) for b in plan.buffers)
    return (lanes, edges, buffers, tuple(plan.meta["step_markers"]),
            plan.policy.schedule.stream_run_ahead)


def plan_outline(plan: Plan) -> tuple:
    """A few figures of plan_signature's, cheap to take (each lane's task count, the buffers'
    count and bytes, the step markers, the run-ahead): plans whose outlines differ cannot sign
    alike, so a memo signs a plan only when an outline matches."""
    return (tuple((lane, len(order)) for lane, order in plan.lane_order.items()),
            len(plan.buffers), sum(b.bytes for b in plan.buffers),
            tuple(plan.meta["step_markers"]), plan.policy.schedule.stream_run_ahead)


class _MemoEntry:
    """One simulation kept: what it ran (its plan, signed only when another plan's outline
    matches it) at which setting of the cost model, and its run."""

    __slots__ = ("outline", "plan", "profile", "run", "setting", "signature")

    def __init__(self, profile: HardwareProfile, setting: tuple, plan: Plan, outline: tuple,
                 run: tuple):
        self.profile, self.setting, self.plan, self.run = profile, setting, plan, run
        self.outline = outline  # plan_outline(plan)
        self.signature: tuple | None = None

    def signed(self) -> tuple:
        if self.signature is None:
            self.signature = plan_signature(self.plan)
        return self.signature


class SimulationMemo:
    """The last few simulations, by what was simulated (plan_signature, the cost model's GPU
    speed and knobs, the profile): a search that meets the same plan again (settling its
    clock, or another candidate's policy making the same plan) gets the run back. A plan is
    signed only where its outline matches a kept one's (most plans a search meets are new:
    signing and hashing each was ~5% of a tune). It keeps at most `size` runs, and only so many
    as hold `max_tasks` tasks in their plans together (a kept run keeps its plan alive)."""

    def __init__(self, size: int = 8, max_tasks: int | None = None):
        self.size, self.max_tasks = size, max_tasks
        self._runs: list[_MemoEntry] = []  # least recently used first
        self._tasks = 0  # in the kept runs' plans

    def _find(self, plan: Plan, outline: tuple, profile: HardwareProfile,
              setting: tuple) -> _MemoEntry | None:
        """The kept run of this plan (of this outline) at this setting on this very profile,
        if any."""
        signature = None
        for entry in self._runs:
            if entry.profile is not profile or entry.setting != setting or entry.outline != outline:
                continue
            if entry.plan.graph is plan.graph and entry.plan.buffers is plan.buffers:
                return entry  # the same plan built once (tuner.plans), another policy's copy
            signature = plan_signature(plan) if signature is None else signature
            if entry.signed() == signature:
                return entry
        return None

    def steady(self, plan: Plan, costs: CostModel, *, label: str, profile_name: str,
               keep_memory: bool = True) -> tuple[Trace, float, dict[str, float], dict]:
        setting = (costs.gpu_speedup, costs.lanes_first, label, profile_name, keep_memory)
        outline = plan_outline(plan)
        entry = self._find(plan, outline, costs.profile, setting)
        if entry is None:
            run = _steady_step(plan, costs, label=label, profile_name=profile_name,
                               keep_memory=keep_memory)
            entry = _MemoEntry(costs.profile, setting, plan, outline, run)
            self._runs.append(entry)
            self._tasks += len(plan.graph)
            while len(self._runs) > self.size or (
                    self.max_tasks is not None and self._tasks > self.max_tasks
                    and len(self._runs) > 1):
                self._tasks -= len(self._runs.pop(0).plan.graph)
        else:
            self._runs.remove(entry)
            self._runs.append(entry)
        return entry.run


def step_floors(plan: Plan, costs: CostModel) -> dict[str, float]:
    """Per-step lower bounds: 'lane:<name>' is the lane's work alone, 'dispatch:<name>' the
    host time to enqueue a stream lane's tasks, '<resource>' is the total use of a shared
    resource (host memory, PCIe, NVMe) over its capacity; the cores are left out (the CPU lanes'
    kernels take all of them: their floor is those lanes'). Uses step 0's tasks: every step
    does the same work."""
    floors: dict[str, float] = {}
    capacities = costs.capacities()
    for task in plan.tasks:
        if task.step == 0:
            _add_floor_terms(floors, task, costs, capacities)
    return floors


def _add_floor_terms(floors: dict[str, float], task, costs: CostModel,
                     capacities: dict[str, float]) -> None:
    """Add a task's terms to step_floors' keys: its lane's time, its dispatch, its share of
    each shared resource but the cores."""
    cost = costs.cost(task)
    key = f"lane:{task.lane}"
    floors[key] = floors.get(key, 0.0) + cost.solo_s
    if cost.dispatch_s:
        key = f"dispatch:{task.lane}"
        floors[key] = floors.get(key, 0.0) + cost.dispatch_s
    for resource, rate in cost.uses:
        if resource == HOST_CORES:
            continue
        floors[resource] = floors.get(resource, 0.0) + rate * cost.solo_s / capacities[resource]


def floors_by_block(plan: Plan, costs: CostModel,
                    kinds: Collection[str] | None = None) -> dict[int, dict[str, float]]:
    """step_floors' terms per block (step 0's tasks of each block, or those of `kinds`, summed
    by key as there): what a search bounds a deeper model's floors with, or a plan's once some
    blocks' work moves elsewhere (tuner.bounds)."""
    capacities = costs.capacities()
    out: dict[int, dict[str, float]] = {}
    for task in plan.tasks:
        if task.step != 0 or (kinds is not None and task.kind not in kinds):
            continue
        _add_floor_terms(out.setdefault(task.block, {}), task, costs, capacities)
    return out


def simulate(plan: Plan, profile: HardwareProfile, *, gpu_memory_bytes: int | None = None,
             label: str = "", costs: CostModel | None = None,
             settle_clock: bool = True, memo: SimulationMemo | None = None,
             keep_trace: bool = True) -> Prediction:
    """Predict the plan's steady-state step on the profile. Plans whose static buffers already
    overflow a tier are rejected without simulating; others are simulated and then checked.
    With settle_clock, where the profile has a GPU busy speedup, the GPU's speed is settled
    against its busy fraction over a few simulations (Prediction.gpu_speedup), starting from
    `costs` (a cost model of this profile to reuse) where given; without, it stays at costs'.
    A cost model made for other executor knobs than the plan's (CostModel.lanes_first) is
    replaced by one at the same GPU speed for the plan's. `memo`: simulations of this plan
    already run (a search simulating a plan again to settle its clock starts where it was).
    keep_trace=False: a prediction without its trace (a search's: the memory samples are not
    kept, the peaks are the same)."""
    if plan.num_steps < STEADY_STEPS:
        raise ValueError(f"the plan has {plan.num_steps} steps: plan at least "
                         f"{STEADY_STEPS} so that the last one is a steady-state step "
                         "(the first starts with no optimizer work behind it)")
    gpus, hosts = plan.placement.gpus, plan.placement.hosts
    check_ranks(profile, gpus, hosts)
    tokens = plan.train.global_tokens_per_step  # every rank's: they all step at once
    early = static_rejection(plan.buffers, tokens, profile, gpu_memory_bytes=gpu_memory_bytes,
                             label=label, ranks_per_host=gpus, hosts=hosts)
    if early is not None:
        return early
    limits = memory_limits(profile, gpu_memory_bytes)
    settle_clock = settle_clock and profile.gpu.busy_speedup is not None
    lanes_first = plan.policy.executor.lanes_first
    ranks = {"gpus": gpus, "hosts": hosts}
    if costs is None or (costs.lanes_first, costs.gpus, costs.hosts) != (lanes_first, gpus,
                                                                          hosts):
        # the plan's own launch price and ranks
        costs = CostModel(profile, gpu_speedup=costs.gpu_speedup if costs else 1.0,
                          lanes_first=lanes_first, **ranks)
    steady = memo.steady if memo is not None else _steady_step
    trace, step_s, busy, peaks = steady(plan, costs, label=label or plan.model.name,
                                        profile_name=profile.name, keep_memory=keep_trace)
    # A power-capped GPU computes faster the more it idles (GPUSpec.busy_speedup), and how much
    # it idles depends on how fast it computes. The step's answer to the GPU's speed is read
    # off the simulations so far (held at first, then a + b / speedup through the last two),
    # the speedup where clock and busy fraction agree is found on that without simulating, and
    # simulating there gives the next point. A CPU-bound step does not move (two simulations);
    # one that stays near busy 1 needs no second.
    gpu_tasks = [t for t in plan.tasks if t.lane == "gpu" and t.step == 0]
    seen = [(costs.gpu_speedup, step_s)]
    for _ in range(CLOCK_ROUNDS if settle_clock else 0):
        speedup = _clock_fixed_point(profile, gpu_tasks, _step_at(seen), costs.gpu_speedup)
        if abs(speedup - costs.gpu_speedup) < CLOCK_TOLERANCE:
            break
        costs = CostModel(profile, gpu_speedup=speedup, lanes_first=lanes_first, **ranks)
        trace, step_s, busy, peaks = steady(plan, costs, label=label or plan.model.name,
                                            profile_name=profile.name, keep_memory=keep_trace)
        seen.append((speedup, step_s))
    peaks = {t: peaks[t] for t in TIERS}
    flops_per_step = plan.model.training_flops_per_token(plan.train.seq_len) * tokens
    flops_per_s = flops_per_step / step_s
    pools, reserves = trace.meta["gpu_pool_peak_bytes"], trace.meta["gpu_pool_reserved_bytes"]
    runtime = plan.runtime_bytes("gpu")
    need = {**peaks, "gpu": gpu_need_bytes(peaks["gpu"], reserves, runtime)}
    return Prediction(
        label=label, tokens_per_step=tokens, limits_bytes=limits, peak_bytes=peaks,
        overflows=_overflows(need, limits, profile, gpus), step_s=step_s,
        tokens_per_s=tokens / step_s, model_flops_per_s=flops_per_s,
        mfu=flops_per_s / (profile.gpu.bf16_flops_per_s * gpus * hosts),
        ranks_per_host=gpus, hosts=hosts,
        lane_busy=busy, bottleneck=max(busy, key=busy.get) if busy else None,
        floors_s=step_floors(plan, costs), trace=trace if keep_trace else None,
        gpu_runtime_bytes=runtime,
        gpu_pool_peak_bytes=pools, gpu_pool_reserved_bytes=reserves, gpu_speedup=costs.gpu_speedup,
        gpu_held_peak_bytes=trace.meta["gpu_held_peak_bytes"],
    )
