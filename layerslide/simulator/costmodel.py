"""Cost model: how long a task takes alone on a hardware profile, and which shared resources
(host memory bandwidth, the CPU's cores, the PCIe link, the NVMe device, the GPU interconnect,
the network) it draws on while it runs. A plan of several ranks per host is costed as one rank
on its share of the host (simulator/ranks.py).

The one place the simulator gets durations from. It reads a Task's amounts (FLOPs, bytes,
params, tokens, host ops) and the profile; it knows nothing about how the plan was built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from layerslide.hwprofiles import HardwareProfile
from layerslide.kinds import Lane, TaskKind
from layerslide.planner.plan import Task
from layerslide.simulator.collectives import group_ranks, ring_traffic
from layerslide.simulator.ranks import check_ranks, rank_share

# Shared resources and what their capacity is in the profile.
HOST_MEMORY = "host_memory"  # bytes/s, host.memory_bytes_per_s
PCIE = "pcie"  # bytes/s of both directions together, link.duplex_bytes_per_s
NVME = "nvme"  # fraction of the device's time (reads and writes take turns, or storage.duplex)
# cores, host.cores: the CPU lanes' kernels (AdamW, casts) run a thread on every core, and a
# stream lane's host thread takes host.dispatch_cores of them while it launches kernels. H200
# machine: a thread launching kernels flat out slowed AdamW by 4-17% at decoder-layer sizes
# (benchmarks/results/archive/adamw_blocks_2026-11-30), the chunks of a call waiting on the thread
# that shares its core.
HOST_CORES = "host_cores"
# bytes/s one way of the rank's GPU interconnect (interconnect.bandwidth; not for kind "host",
# whose collectives take PCIE and HOST_MEMORY like the copies), and of its share of the host's
# network cards (network.bandwidth x nics / ranks of the host): the gather and reduce lanes'
# collectives run at once on them
INTERCONNECT = "interconnect"
NETWORK = "network"

# A weight that water-filling always satisfies in full (a dispatch taking every core, unslowed).
UNSLOWED_SHARE = 1e6
# A fp32->bf16 cast reads 4 bytes and writes 2 per parameter.
CAST_TRAFFIC_PER_READ_BYTE = 1.5


@dataclass(frozen=True, kw_only=True)
class Cost:
    """A task's work alone (its lane's busy time: for a GPU task the GPU's, not its dispatch),
    its host dispatch, and its draw on shared resources while running at full speed."""

    solo_s: float  # its lane's work alone (a GPU task: the GPU's busy time)
    # Host time to enqueue a stream task alone (the executor's lane thread launching its
    # kernels; longer while the CPU's kernels hold the cores: dispatch_uses). It may run ahead,
    # while the task's inputs are still in flight; the task cannot finish before its dispatch.
    dispatch_s: float = 0.0
    uses: tuple[tuple[str, float], ...] = ()  # (resource, units per second at full speed)
    dispatch_uses: tuple[tuple[str, float], ...] = ()  # the same, of its dispatch
    dispatch_share: float = 1.0  # the dispatch's weight on them (CostModel.dispatch_share)
    share: float = 1.0  # weight when an oversubscribed resource is split
    tag: str = ""  # what kind of use ("read", "write"): see CostModel.mixed_capacities


class CostModel:
    """Durations and resource draws of plan tasks on one hardware profile."""

    def __init__(self, profile: HardwareProfile, *, gpu_speedup: float = 1.0,
                 lanes_first: bool = False, gpus: int = 1, hosts: int = 1):
        """gpu_speedup: how much faster than the profile's efficiency tables the GPU computes
        (at the busy fraction the simulator found: GPUSpec.speedup_at_busy); lanes_first: the
        plan's CPU kernels run niced (ExecutorKnobs.lanes_first), its launches beside them
        priced at host.kernel_launch_beside_niced_kernels where the profile has it; gpus and
        hosts: the plan's ranks per host and hosts (Placement.gpus, .hosts), costed as one
        rank on its share of the host (ranks.rank_share)."""
        if not gpu_speedup > 0:
            raise ValueError(f"gpu_speedup must be > 0, got {gpu_speedup}")
        check_ranks(profile, gpus, hosts)
        self.gpus, self.hosts = gpus, hosts
        self.profile = rank_share(profile, gpus)
        # the drives as one (the tier stripes evenly), at this rank's share
        self.storage = self.profile.storage.striped()
        self.gpu_speedup = gpu_speedup
        self.lanes_first = lanes_first
        self._efficiency_cache: dict[int, float] = {}
        self._costs: dict[tuple, Cost] = {}
        self.dispatch_share = self._dispatch_share()

    def _dispatch_share(self) -> float:
        """A dispatch's weight against the CPU's kernels (weight 1, every core) on HOST_CORES:
        the one at which water-filling leaves it gpu.kernel_launch / host.kernel_launch_beside_
        kernels (at most 1) of its speed alone beside one such kernel, r = C w / (C + d w) for
        C cores and d dispatch_cores; two kernels at once slow it further. 1.0 (equal weights)
        where the profile has no such figure. A lanes-first plan takes the price beside niced
        kernels where measured, else the plain one."""
        host = self.profile.host
        beside_s = host.kernel_launch_beside_kernels_s
        if self.lanes_first and host.kernel_launch_beside_niced_kernels_s is not None:
            beside_s = host.kernel_launch_beside_niced_kernels_s
        if beside_s is None:
            return 1.0
        cores, taken = float(host.cores), host.dispatch_cores
        rate = min(self.profile.gpu.kernel_launch_s / beside_s, 1.0)
        if cores - rate * taken <= 0:  # a dispatch taking every core, unslowed
            return UNSLOWED_SHARE
        return rate * cores / (cores - rate * taken)

    def capacities(self) -> dict[str, float]:
        p = self.profile
        out = {HOST_MEMORY: p.host.memory_bytes_per_s, PCIE: p.link.duplex_bytes_per_s,
               NVME: 1.0, HOST_CORES: float(p.host.cores)}
        if p.interconnect is not None and p.interconnect.kind != "host":
            out[INTERCONNECT] = p.interconnect.bandwidth_bytes_per_s
        if p.network is not None:
            out[NETWORK] = p.network.host_bytes_per_s / self.gpus
        return out

    def mixed_capacities(self) -> dict[str, float]:
        """Capacities while reads and writes run on the disk at once (one flow each way: each
        NVMe lane runs one task at a time). Each takes 1.0 of the device's time at its own rate
        r or w; a disk that moves `storage.duplex` together gives the reads `read_share` of it
        and the writes the rest (see _disk), time fractions duplex * s / r + duplex (1 - s) / w.
        Where a direction cannot take its part it runs at its full rate and the other moves the
        rest, up to its own."""
        storage = self.storage
        if storage.duplex_bytes_per_s is None:
            return {}
        read, write = self.duplex_split()
        return {NVME: read / storage.read_bytes_per_s + write / storage.write_bytes_per_s}

    def duplex_split(self) -> tuple[float, float]:
        """Bytes/s (read, write) while both directions run: storage.duplex split by the read
        share, a direction capped at its own rate handing the rest to the other."""
        storage = self.storage
        duplex, r, w = (storage.duplex_bytes_per_s, storage.read_bytes_per_s,
                        storage.write_bytes_per_s)
        if duplex is None:
            raise ValueError(f"profile {self.profile.name}: storage.duplex is not given, so "
                             "reads and writes take turns and have no split")
        read = min(duplex * storage.read_share, r)
        write = min(duplex - read, w)
        return min(duplex - write, r), write

    def efficiency(self, tokens: int) -> float:
        if tokens not in self._efficiency_cache:
            self._efficiency_cache[tokens] = self.profile.gpu.matmul_efficiency_at(max(tokens, 1))
        return self._efficiency_cache[tokens]

    def cost(self, task: Task) -> Cost:
        """The task's cost, worked out once per shape (a block's tasks repeat across layers,
        micro-batches and steps): the rules read only the fields of shape_of."""
        shape = shape_of(task)
        cost = self._costs.get(shape)
        if cost is None:
            rule = RULES.get(task.kind)
            if rule is None:
                raise ValueError(f"task {task.id}: no cost model for kind {task.kind!r}")
            cost = self._costs[shape] = rule(self, task)
        return cost

    # --- the rules: GPU work, CPU kernels, copies, disk I/O ------------------------------------
    def _gpu(self, t: Task) -> Cost:
        gpu = self.profile.gpu
        busy_s = 0.0
        if t.flops:
            busy_s += t.flops / (gpu.bf16_flops_per_s * self.efficiency(t.tokens))
        if t.attention_flops:
            if t.kind == TaskKind.BACKWARD:  # recompute forward + backward: 3x the forward FLOPs
                both = gpu.attention_efficiency_at(t.tokens, backward=True)
                busy_s += 3 * t.attention_flops / (gpu.bf16_flops_per_s * both)
            else:
                forward = gpu.attention_efficiency_at(t.tokens, backward=False)
                busy_s += t.attention_flops / (gpu.bf16_flops_per_s * forward)
        busy_s /= self.gpu_speedup  # the clocks, not the memory, follow the power cap
        busy_s += t.bytes / gpu.hbm_bytes_per_s
        # Dispatches overlap with the GPU's work (and with the wait for the task's inputs); a
        # task is host-bound only when they take longer.
        dispatch_s = t.host_ops * gpu.kernel_launch_s
        return Cost(solo_s=busy_s, dispatch_s=dispatch_s,
                    dispatch_uses=((HOST_CORES, self.profile.host.dispatch_cores),)
                    if dispatch_s > 0 else (), dispatch_share=self.dispatch_share)

    def _copy(self, t: Task, rate: float, memory_cost: float, share: float) -> Cost:
        """A copy draws on the link at its rate and on host memory at memory_cost per byte
        (see HostSpec: what a DMA byte takes from the capacity the CPU shares)."""
        return Cost(solo_s=t.bytes / rate, uses=((PCIE, rate), (HOST_MEMORY, rate * memory_cost)),
                    share=share)

    def _h2d(self, t: Task) -> Cost:
        host = self.profile.host
        return self._copy(t, self.profile.link.h2d_bytes_per_s, host.dma_read_cost,
                          host.dma_share)

    def _d2h(self, t: Task) -> Cost:
        host = self.profile.host
        return self._copy(t, self.profile.link.d2h_bytes_per_s, host.dma_write_cost,
                          host.d2h_share)

    def _cpu_kernel(self, solo: float, traffic: float) -> Cost:
        """A CPU kernel (on every core) alone for `solo` seconds, moving `traffic` host bytes."""
        cores = (HOST_CORES, float(self.profile.host.cores))
        return Cost(solo_s=solo, uses=((HOST_MEMORY, traffic / solo), cores) if solo > 0 else ())

    def _optimizer_step(self, t: Task) -> Cost:
        if t.lane == Lane.GPU:  # a GPU-updated block: its AdamW is GPU work
            return self._gpu(t)
        host = self.profile.host
        # t.bytes: beyond fp32 AdamW's (a grad upcast; fewer with compact moments)
        # a call's fixed part, then its bytes at the large-block rate
        traffic = t.params * host.adamw_bytes_per_param + t.bytes
        solo = ((host.adamw_call_s if t.params else 0.0)
                + traffic / (host.adamw_params_per_s * host.adamw_bytes_per_param))
        measured = host.compact_adamw_params_per_s(t.moment_precision)
        if measured:  # its compute may bound it before its bytes do (a rate per call)
            solo = max(solo, t.params / measured)
        return self._cpu_kernel(solo, traffic)

    # A cast and a sum of landed grads both stream over host memory at the cast's traffic rate
    # (a cast reads 4 B and writes 2 B per param; cast_bytes_per_s counts the 4 read).
    def _cast(self, t: Task) -> Cost:
        traffic = t.bytes * CAST_TRAFFIC_PER_READ_BYTE
        return self._cpu_kernel(traffic / self._cast_traffic_bytes_per_s(), traffic)

    def _accumulate_grads(self, t: Task) -> Cost:
        return self._cpu_kernel(t.bytes / self._cast_traffic_bytes_per_s(), t.bytes)

    def _cast_traffic_bytes_per_s(self) -> float:
        return self.profile.host.cast_bytes_per_s * CAST_TRAFFIC_PER_READ_BYTE

    def _grad_norm(self, t: Task) -> Cost:
        return Cost(solo_s=0.0)  # partial norms come with the grads; this is a barrier

    def _disk(self, t: Task, rate: float, tag: str, memory_cost: float) -> Cost:
        storage = self.storage
        solo = t.bytes / rate
        share = self.profile.host.dma_share
        if storage.duplex_bytes_per_s is not None:
            # a disk measured reading and writing at once splits its bytes between the
            # directions, not its time (H200 machine: reads ~60% beside the NVMe tier's writes,
            # benchmarks/results/archive/sharing_2026-11-30): a flow's weight is its bytes over its
            # rate, scaled so that an even split keeps dma_share's size against host-memory
            # users (the weight is the flow's on every resource it uses)
            read, write = self.duplex_split()
            moved = read if tag == "read" else write
            share *= (storage.read_bytes_per_s + storage.write_bytes_per_s) / rate * moved / (
                read + write)
        # the disk's DMA writes host memory on a read and reads it on a write, like a D2H / H2D
        return Cost(solo_s=solo, uses=((NVME, 1.0), (HOST_MEMORY, rate * memory_cost)),
                    share=share, tag=tag)

    def _nvme_read(self, t: Task) -> Cost:
        return self._disk(t, self.storage.read_bytes_per_s, "read",
                          self.profile.host.dma_write_cost)

    def _nvme_write(self, t: Task) -> Cost:
        return self._disk(t, self.storage.write_bytes_per_s, "write",
                          self.profile.host.dma_read_cost)

    # --- collectives between ranks: a ring over the group's link ------------------------------
    def _collective(self, t: Task) -> Cost:
        """A ring collective: its steps' latency plus the bytes each rank sends at the link's
        rate, drawing on the link's resources at their average over that time."""
        sent, steps = ring_traffic(t.kind, t.bytes, group_ranks(t.comm_group, self.gpus,
                                                                 self.hosts))
        if not steps:
            return Cost(solo_s=0.0)
        crosses_hosts = t.comm_group == "peers" or (t.comm_group == "world" and self.hosts > 1)
        rate, latency_s, per_byte = (self._network_path() if crosses_hosts
                                     else self._interconnect_path())
        solo = steps * latency_s + sent / rate
        flow = sent / solo
        return Cost(solo_s=solo, uses=tuple((r, flow * k) for r, k in per_byte),
                    share=self.profile.host.dma_share if PCIE in dict(per_byte) else 1.0)

    def _interconnect_path(self) -> tuple[float, float, tuple[tuple[str, float], ...]]:
        """(rate, step latency, resource units per byte sent) between a host's GPUs."""
        ic = self.profile.interconnect
        if ic.kind == "host":
            return self._staged(ic.bandwidth_bytes_per_s, ic.latency_s)
        if ic.kind == "pcie_p2p":  # each byte leaves over one GPU's link, arrives over another's
            link = self.profile.link
            rate = min(ic.bandwidth_bytes_per_s, link.h2d_bytes_per_s, link.d2h_bytes_per_s)
            return rate, ic.latency_s, ((INTERCONNECT, 1.0), (PCIE, 2.0))
        return ic.bandwidth_bytes_per_s, ic.latency_s, ((INTERCONNECT, 1.0),)

    def _network_path(self) -> tuple[float, float, tuple[tuple[str, float], ...]]:
        """Between hosts: the rank's share of its host's network cards. GPUs without
        peer-to-peer have no GPUDirect RDMA either: their bytes pass through host memory."""
        net = self.profile.network
        rate = net.host_bytes_per_s / self.gpus
        ic = self.profile.interconnect
        if ic is not None and ic.kind == "host":
            staged, _, per_byte = self._staged(rate, net.latency_s)
            return staged, net.latency_s, ((NETWORK, 1.0), *per_byte)
        return rate, net.latency_s, ((NETWORK, 1.0),)

    def _staged(self, cap: float | None,
                latency_s: float) -> tuple[float, float, tuple[tuple[str, float], ...]]:
        """Through host memory: each byte sent goes down the GPU's link (a D2H writing host
        memory) and each received comes up it (an H2D reading host memory), both at once."""
        link, host = self.profile.link, self.profile.host
        rate = min(link.h2d_bytes_per_s, link.d2h_bytes_per_s, link.duplex_bytes_per_s / 2)
        rate = rate if cap is None else min(rate, cap)
        return rate, latency_s, ((PCIE, 2.0),
                                 (HOST_MEMORY, host.dma_read_cost + host.dma_write_cost))


# What a task's cost depends on: its kind, lane and amounts (not its id, block or step), as a
# tuple; an attrgetter, as a search takes every task's shape
shape_of: Callable[[Task], tuple] = attrgetter(
    "kind", "lane", "flops", "attention_flops", "bytes", "params", "tokens", "host_ops",
    "moment_precision", "comm_group")


# The rule of each kind. Copies and disk I/O are costed as the transfer they are (their lane's
# link or drive), whatever they move; a GPU-updated block's optimizer step is GPU work like a
# compute task's (CostModel._optimizer_step).
RULES: dict[TaskKind, Callable[[CostModel, Task], Cost]] = {
    TaskKind.FORWARD: CostModel._gpu, TaskKind.BACKWARD: CostModel._gpu,
    TaskKind.HEAD: CostModel._gpu,
    TaskKind.OPTIMIZER_STEP: CostModel._optimizer_step,
    TaskKind.CAST: CostModel._cast, TaskKind.ACCUMULATE_GRADS: CostModel._accumulate_grads,
    TaskKind.GRAD_NORM: CostModel._grad_norm,
    TaskKind.LOAD_WEIGHTS: CostModel._h2d, TaskKind.FETCH_ACTIVATION: CostModel._h2d,
    TaskKind.OFFLOAD_ACTIVATION: CostModel._d2h, TaskKind.OFFLOAD_GRADS: CostModel._d2h,
    TaskKind.READ_STATE: CostModel._nvme_read, TaskKind.READ_ACTIVATION: CostModel._nvme_read,
    TaskKind.READ_WEIGHTS: CostModel._nvme_read,
    TaskKind.WRITE_STATE: CostModel._nvme_write, TaskKind.WRITE_ACTIVATION: CostModel._nvme_write,
    TaskKind.GATHER_WEIGHTS: CostModel._collective, TaskKind.REDUCE_GRADS: CostModel._collective,
    TaskKind.ALL_REDUCE_GRADS: CostModel._collective, TaskKind.REDUCE_NORM: CostModel._collective,
}
