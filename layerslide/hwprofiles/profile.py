"""Hardware profile dataclasses: a GPU, its host link, the host and its storage, in SI units."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Any

from .fabric import ASSUMED_NETWORK, InterconnectSpec, NetworkSpec

# The dotted TOML field each override changes; sources use the same keys as the files.
_OVERRIDE_FIELDS = {
    "gpu_memory_bytes": ("gpu", "memory_bytes", "gpu.memory"),
    "ram_bytes": ("host", "ram_bytes", "host.ram"),
    "nvme_capacity_bytes": ("storage", "capacity_bytes", "storage.capacity"),
    "nvme_drives": ("storage", "drives", "storage.drives"),
}


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator: memory, bf16 peak, HBM bandwidth and how much of the peak GEMMs reach."""

    name: str
    memory_bytes: int
    bf16_flops_per_s: float
    hbm_bytes_per_s: float
    matmul_efficiency: tuple[tuple[int, float], ...]
    # Attention (SDPA) throughput as a fraction of peak, with FLOPs counted as 4*seq*heads*
    # head_dim per token forward (non-causal count); tokens = micro-batch x sequence length.
    attention_forward_efficiency: tuple[tuple[int, float], ...]
    attention_backward_efficiency: tuple[tuple[int, float], ...]  # forward + backward, 3x FLOPs
    kernel_launch_s: float
    # (busy fraction, speedup) points: how much faster than the tables above (measured under
    # continuous load) the GPU computes when it is busy that fraction of the time. A GPU at its
    # power cap clocks up when it idles between bursts: the H200 machine ran a 3B layer's GEMMs
    # at 1470-1515 MHz busy 100% of the time and 1800-1980 MHz at 50%, 1.18x as fast
    # (benchmarks/results/archive/validation_2026-11-30d, gpu_duty_probe.py). None: the tables at
    # any duty.
    busy_speedup: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("matmul_efficiency", "attention_forward_efficiency",
                     "attention_backward_efficiency"):
            points = getattr(self, name)
            if not points:
                raise ValueError(f"{name} needs at least one (tokens, efficiency) point")
            tokens = [t for t, _ in points]
            if any(b <= a for a, b in pairwise(tokens)):
                raise ValueError(f"{name} tokens must be strictly increasing, got {tokens}")
        if self.busy_speedup is not None:
            busy = [b for b, _ in self.busy_speedup]
            if (not busy or any(b <= a for a, b in pairwise(busy))
                    or not (0 < busy[0] and busy[-1] <= 1)):
                raise ValueError("busy_speedup needs busy fractions in (0, 1], strictly "
                                 f"increasing, got {busy}")
            if any(not x > 0 for _, x in self.busy_speedup):
                raise ValueError(f"busy_speedup speedups must be > 0, got {self.busy_speedup}")

    def speedup_at_busy(self, busy: float) -> float:
        """How much faster than the efficiency tables the GPU computes busy this fraction of the
        time: linear between the measured points, clamped at both ends (1 without a table)."""
        points = self.busy_speedup
        if points is None:
            return 1.0
        if busy <= points[0][0]:
            return points[0][1]
        for (b0, x0), (b1, x1) in pairwise(points):
            if busy <= b1:
                return x0 + (x1 - x0) * (busy - b0) / (b1 - b0)
        return points[-1][1]

    def matmul_efficiency_at(self, tokens: int) -> float:
        """Fraction of bf16 peak a GEMM with `tokens` rows reaches; linear in log2, clamped."""
        return _interpolate(self.matmul_efficiency, tokens)

    def attention_efficiency_at(self, tokens: int, *, backward: bool) -> float:
        """Fraction of bf16 peak attention reaches over `tokens` (forward, or forward+backward)."""
        table = self.attention_backward_efficiency if backward else self.attention_forward_efficiency
        return _interpolate(table, tokens)


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """The host<->GPU link: pinned copy rates each way, both at once, and pageable H2D."""

    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    duplex_bytes_per_s: float
    h2d_pageable_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """The CPU side: cores, RAM, shared memory bandwidth and the optimizer/cast throughputs."""

    cores: int
    ram_bytes: int
    memory_bytes_per_s: float
    adamw_params_per_s: float
    adamw_bytes_per_param: float
    cast_bytes_per_s: float
    # How DMA and the CPU share memory_bytes_per_s (calibrate.sharing fits all four): a copied
    # byte takes dma_read_cost (the DMA reads host memory: H2D) or dma_write_cost (it writes
    # there: D2H) of the capacity, and an oversubscribed capacity is split by weight, the CPU's
    # 1.0, H2D's dma_share, D2H's dma_write_share (None: dma_share). On the H200 machine a D2H
    # byte cost 0.64 and kept its full rate beside AdamW, an H2D byte 0.42 at weight 0.8
    # (benchmarks/results/archive/sharing_2026-11-30). A cost may be 0: a copy that never slowed
    # AdamW.
    dma_share: float
    # The native AdamW's rate with compact moments (executor/moments.py), measured as
    # adamw_params_per_s is: their rounding and 8-bit codes cost compute, so on some CPUs the
    # step does not speed up by its bytes (benchmarks/results/moments_2026-12-02). None: bound
    # by its bytes alone.
    adamw_bf16_params_per_s: float | None = None
    adamw_int8_params_per_s: float | None = None
    # The fixed part of one AdamW call on a block (starting its threads, the last chunks'
    # tail): a block of n params takes adamw_call_s + n / adamw_params_per_s, so larger blocks
    # run faster (H200 machine: 2.28 ms and 5.10 Gparam/s fit blocks of 17-394 M params,
    # benchmarks/results/archive/adamw_blocks_2026-11-30). 0: every size at adamw_params_per_s.
    adamw_call_s: float = 0.0
    dma_write_share: float | None = None
    dma_read_cost: float = 1.0
    dma_write_cost: float = 1.0
    # Cores a stream lane's host thread takes from the CPU lanes' kernels while it launches
    # kernels (the simulator's HOST_CORES). One thread, one core; a profile may say more: AdamW
    # slowed by s beside a thread launching kernels flat out means cores * s / (1 - s) (at equal
    # weights: see kernel_launch_beside_kernels_s), and the
    # chunks of a call wait on the thread that shares a core (H200 machine: 15% at a 3B layer,
    # 2.8 cores; a profile with 2.8 predicted the validation suite no better than with 1.0,
    # dev/HISTORY.md, session 11). calibrate does not measure it.
    dispatch_cores: float = 1.0
    # Seconds a tiny kernel launch takes from the executor's lane threads while the CPU's
    # kernels (AdamW) run on every core: the GPU lane's enqueue waits for a core and the GIL
    # (H200 machine: a layer's backward enqueue 1.4-1.5x as long beside AdamW as without it,
    # benchmarks/results/archive/validation_2026-12-04b). The simulator weighs a dispatch against
    # the CPU's kernels so that it runs at gpu.kernel_launch over this of its speed alone (and a
    # kernel beside it at cores / (cores + dispatch_cores * weight)). A host figure: a profile
    # that swaps the card keeps it, against the new card's kernel_launch. None: equal weights
    # (a dispatch beside a kernel on every core at cores / (cores + dispatch_cores)).
    kernel_launch_beside_kernels_s: float | None = None
    # The same with the kernels' workers at nice 19 (ExecutorKnobs.lanes_first: the lane
    # threads take a core first; H200 machine 21.9 us where nice 0 was 31.5 on another lease,
    # benchmarks/results/archive/validation_2026-12-04c). Plans that nice them are priced with it;
    # None: with kernel_launch_beside_kernels_s.
    kernel_launch_beside_niced_kernels_s: float | None = None
    # RAM a run cannot have beside its own process: the OS, the CUDA driver's host side,
    # torch.compile's worker processes. Plans must fit ram_bytes less this.
    reserve_bytes: int = 0
    # The most RAM the platform takes (its slots times the largest module at the rated speed);
    # None: no limit known. A variant with more RAM than this is refused.
    ram_max_bytes: int | None = None
    # GPUs the host holds, one rank each: they share its cores, memory bandwidth, RAM and drives
    gpus: int = 1
    # GPUs behind one [link]: 1, each has the link's rates to itself; 2, a pair splits them
    # while both copy (a consumer board's x16 split x8/x8, or a PCIe switch's one uplink)
    gpus_per_link: int = 1

    @property
    def usable_ram_bytes(self) -> int:
        return self.ram_bytes - self.reserve_bytes

    def __post_init__(self) -> None:
        if self.ram_max_bytes is not None and self.ram_bytes > self.ram_max_bytes:
            raise ValueError(f"host ram {self.ram_bytes / 2**30:g} GiB is more than this platform "
                             f"takes (ram_max {self.ram_max_bytes / 2**30:g} GiB)")
        if not 1 <= self.gpus_per_link <= self.gpus:
            raise ValueError(f"host gpus_per_link must lie in 1..gpus={self.gpus}, got "
                             f"{self.gpus_per_link}: how many of the host's GPUs share a link")
        if not 0 < self.dispatch_cores <= self.cores:
            raise ValueError(f"host dispatch_cores must lie in (0, cores={self.cores}], got "
                             f"{self.dispatch_cores}: the cores a thread launching kernels "
                             "takes from the CPU's kernels")

    def compact_adamw_params_per_s(self, moment_precision: str) -> float | None:
        """The measured rate of the native AdamW with these moments, if any (fp32: None, the
        rate its bytes give)."""
        return {"bf16": self.adamw_bf16_params_per_s,
                "int8": self.adamw_int8_params_per_s}.get(moment_precision)

    @property
    def d2h_share(self) -> float:
        return self.dma_share if self.dma_write_share is None else self.dma_write_share


@dataclass(frozen=True, kw_only=True)
class StorageSpec:
    """The NVMe (or whatever disk) tier: `drives` alike, each with these sequential read/write
    rates and capacity. The tier stripes every file evenly over the drives (one folder each),
    so the drives together move and hold `drives` times one drive's (`striped`)."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    capacity_bytes: int
    # bytes/s of reads and writes together while both run; None: they take turns, i.e.
    # (read + write) / 2 together (a slow disk on the H200 machine moved 14-30% less than that)
    duplex_bytes_per_s: float | None = None
    # the reads' part of those bytes; None: an even split. On the H200 machine the NVMe
    # tier's reads took ~60% beside its writes (benchmarks/results/archive/sharing_2026-11-30)
    duplex_read_share: float | None = None
    drives: int = 1
    # The most drives the platform attaches at their full rate (CPU-attached M.2 slots or lanes
    # for them); None: no limit known. A variant with more drives than this is refused.
    drives_max: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.drives, bool) or not isinstance(self.drives, int) or self.drives < 1:
            raise ValueError(f"storage drives must be a whole number >= 1, got {self.drives!r}")
        if self.drives_max is not None and self.drives > self.drives_max:
            raise ValueError(f"{self.drives} NVMe drives are more than this platform attaches at "
                             f"full rate (drives_max {self.drives_max})")
        share = self.duplex_read_share
        if share is not None and not 0 < share < 1:
            raise ValueError(f"storage duplex_read_share must lie in (0, 1), got {share}: "
                             "the reads' part of the bytes moved while both directions run")

    @property
    def read_share(self) -> float:
        return 0.5 if self.duplex_read_share is None else self.duplex_read_share

    @property
    def total_capacity_bytes(self) -> int:
        return self.capacity_bytes * self.drives

    def striped(self) -> StorageSpec:
        """The drives as one: every rate and the capacity times the drive count (an even
        stripe keeps each drive busy for the same share of every read and write)."""
        n = self.drives
        return dataclasses.replace(
            self, read_bytes_per_s=n * self.read_bytes_per_s,
            write_bytes_per_s=n * self.write_bytes_per_s, capacity_bytes=n * self.capacity_bytes,
            duplex_bytes_per_s=(None if self.duplex_bytes_per_s is None
                                else n * self.duplex_bytes_per_s), drives=1)



PRICE_COMPONENTS = ("gpu", "platform", "ram_per_gb", "drive")
PRICE_BASES = ("list", "user")


@dataclass(frozen=True, kw_only=True)
class Price:
    """One component's price: a dated list price with its source, or the user's own figure."""

    value: float
    currency: str
    basis: str  # "list": a published list price on `date`; "user": the user's own figure
    source: str
    date: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) \
                or not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"a price must be a number >= 0, got {self.value!r}")
        if self.basis not in PRICE_BASES:
            raise ValueError(f"price basis must be one of {', '.join(PRICE_BASES)}, got "
                             f"{self.basis!r}")
        if self.basis == "list" and not self.date:
            raise ValueError("a list price needs the date it was listed (date = \"YYYY-MM\")")


@dataclass(frozen=True, kw_only=True)
class Prices:
    """What the machine's parts cost: the GPU, the platform (CPU, board, PSU, case), RAM per GB
    of DIMM capacity (a DIMM's "GB" is a GiB, 2^30 bytes) and one NVMe drive. Any may be
    missing; the total then is unknown."""

    gpu: Price | None = None
    platform: Price | None = None
    ram_per_gb: Price | None = None
    drive: Price | None = None

    def __post_init__(self) -> None:
        currencies = {p.currency for p in self.given().values()}
        if len(currencies) > 1:
            raise ValueError(f"prices mix currencies {sorted(currencies)}: give them all in one")

    def given(self) -> dict[str, Price]:
        return {k: getattr(self, k) for k in PRICE_COMPONENTS if getattr(self, k) is not None}

    @property
    def currency(self) -> str | None:
        return next((p.currency for p in self.given().values()), None)


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A whole machine as data, with a source for every number; built by loader.load_profile."""

    name: str
    description: str
    gpu: GPUSpec
    link: LinkSpec
    host: HostSpec
    storage: StorageSpec
    # hash=False: a read-only mapping is not hashable, and the numbers already identify the machine.
    sources: Mapping[str, str] = field(hash=False)
    path: str | None = None
    prices: Prices = field(default_factory=Prices)
    interconnect: InterconnectSpec | None = None  # between the host's GPUs; None: one GPU
    network: NetworkSpec | None = None  # between hosts; None: one host

    def __post_init__(self) -> None:
        if self.host.gpus > 1 and self.interconnect is None:
            raise ValueError(f"a host of {self.host.gpus} GPUs needs an [interconnect]: how its "
                             "GPUs exchange (kind nvlink, pcie_p2p or host)")
        # Freeze the mapping so a shared profile cannot be edited behind its users' backs.
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def __reduce__(self):
        # mappingproxy cannot be pickled; the tuner sends profiles to worker processes.
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["sources"] = dict(self.sources)
        return _rebuild_profile, (values,)

    def with_overrides(
        self,
        *,
        gpu_memory_bytes: int | None = None,
        ram_bytes: int | None = None,
        nvme_capacity_bytes: int | None = None,
        nvme_drives: int | None = None,
    ) -> HardwareProfile:
        """Return a copy with some capacities replaced (what-if); their sources say "override".
        nvme_capacity_bytes is all the drives' together; nvme_drives keeps each drive's rates
        and capacity (a box with more of the same drive)."""
        drives = self.storage.drives if nvme_drives is None else nvme_drives
        if nvme_capacity_bytes is not None and nvme_capacity_bytes > 0:
            nvme_capacity_bytes = max(nvme_capacity_bytes // max(drives, 1), 1)  # per drive
        given = {
            "gpu_memory_bytes": gpu_memory_bytes,
            "ram_bytes": ram_bytes,
            "nvme_drives": nvme_drives,
            "nvme_capacity_bytes": nvme_capacity_bytes,
        }
        parts: dict[str, Any] = {"gpu": self.gpu, "host": self.host, "storage": self.storage}
        sources = dict(self.sources)
        for arg, value in given.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                what = "drives" if arg == "nvme_drives" else "bytes"
                raise ValueError(f"{arg} must be a positive whole number of {what}, got {value!r}")
            part, attr, key = _OVERRIDE_FIELDS[arg]
            parts[part] = dataclasses.replace(parts[part], **{attr: value})
            sources[key] = "override"
        return dataclasses.replace(self, **parts, sources=sources)

    def with_ranks(self, gpus: int, hosts: int) -> tuple[HardwareProfile, list[str]]:
        """A copy that holds `gpus` of its GPU per host and reaches `hosts` hosts, and what it
        assumed to: where the profile has no interconnect, no peer-to-peer (collectives through
        host memory, the slowest way); where it has no network, ASSUMED_NETWORK. The profile
        itself, and nothing assumed, where it holds them already. For a run's prediction on a
        machine its profile describes only in part; `simulate` refuses such a plan instead."""
        assumed, profile = [], self
        if gpus > self.host.gpus:
            interconnect = self.interconnect
            if interconnect is None:
                interconnect = InterconnectSpec(kind="host")
                assumed.append("no peer-to-peer between its GPUs (collectives through host "
                               "memory)")
            host = dataclasses.replace(self.host, gpus=gpus, gpus_per_link=1)
            sources = {**self.sources, "host.gpus": "override: the run's ranks per host"}
            profile = dataclasses.replace(profile, host=host, interconnect=interconnect,
                                          sources=sources)
        if hosts > 1 and self.network is None:
            assumed.append(f"a {ASSUMED_NETWORK.bandwidth_bytes_per_s * 8 / 1e9:.0f} Gbit/s "
                           "network between hosts")
            profile = dataclasses.replace(profile, network=ASSUMED_NETWORK)
        return profile, assumed

    def with_adamw_rate(self, params_per_s: float, source: str) -> HardwareProfile:
        """A copy whose CPU AdamW runs at params_per_s, and with it the host memory's capacity
        (calibrate keeps that as a ratio to AdamW's rate: calibrate.sharing) and the compact
        moments' rates (the same memory-bound kernel); their sources add `source`."""
        if not (params_per_s > 0 and math.isfinite(params_per_s)):
            raise ValueError(f"an AdamW rate must be a positive number, got {params_per_s!r}")
        host, scale = self.host, params_per_s / self.host.adamw_params_per_s

        def scaled(value: float | None) -> float | None:
            return None if value is None else value * scale
        host = dataclasses.replace(
            host, adamw_params_per_s=params_per_s,
            memory_bytes_per_s=host.memory_bytes_per_s * scale,
            adamw_bf16_params_per_s=scaled(host.adamw_bf16_params_per_s),
            adamw_int8_params_per_s=scaled(host.adamw_int8_params_per_s))
        sources = dict(self.sources)
        for key, value in (("adamw_throughput", host.adamw_params_per_s),
                           ("memory_bandwidth", host.memory_bytes_per_s),
                           ("adamw_bf16_throughput", host.adamw_bf16_params_per_s),
                           ("adamw_int8_throughput", host.adamw_int8_params_per_s)):
            if value is not None:  # what it was measured as, then how it changed
                was = sources.get(f"host.{key}")
                sources[f"host.{key}"] = f"{was}; then {source}" if was else source
        return dataclasses.replace(self, host=host, sources=sources)

    def cost_breakdown(self) -> dict[str, float] | None:
        """What each part of this machine costs (its GPUs at the price per GPU, platform, its RAM
        at the price per GB, its drives at the price per drive), or None where a price is
        missing."""
        pr = self.prices
        if None in (pr.gpu, pr.platform, pr.ram_per_gb, pr.drive):
            return None
        return {"gpu": pr.gpu.value * self.host.gpus, "platform": pr.platform.value,
                "ram": pr.ram_per_gb.value * self.host.ram_bytes / 2**30,
                "drives": pr.drive.value * self.storage.drives}

    def cost(self) -> float | None:
        """The machine's total price in prices.currency, or None where a price is missing."""
        parts = self.cost_breakdown()
        return None if parts is None else sum(parts.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict in SI units (bytes, seconds, bytes/s, FLOP/s, params/s)."""
        gpu = dataclasses.asdict(self.gpu)
        gpu["matmul_efficiency"] = [[t, e] for t, e in self.gpu.matmul_efficiency]
        return {
            "name": self.name,
            "description": self.description,
            "path": self.path,
            "gpu": gpu,
            "link": dataclasses.asdict(self.link),
            "host": dataclasses.asdict(self.host),
            "storage": dataclasses.asdict(self.storage),
            "sources": dict(self.sources),
            "prices": {k: dataclasses.asdict(v) for k, v in self.prices.given().items()},
            "interconnect": _asdict_or_none(self.interconnect),
            "network": _asdict_or_none(self.network),
            "cost": self.cost(),
        }


def _asdict_or_none(spec) -> dict | None:
    return None if spec is None else dataclasses.asdict(spec)


def _rebuild_profile(values: dict) -> HardwareProfile:
    return HardwareProfile(**values)


def _interpolate(points: tuple[tuple[int, float], ...], tokens: int) -> float:
    """Piecewise-linear in log2(tokens) through (tokens, value) points, clamped at both ends."""
    if tokens <= 0:
        raise ValueError(f"tokens must be > 0, got {tokens}")
    if tokens <= points[0][0]:
        return points[0][1]
    if tokens >= points[-1][0]:
        return points[-1][1]
    x = math.log2(tokens)
    for (t0, e0), (t1, e1) in pairwise(points):
        if tokens <= t1:
            x0, x1 = math.log2(t0), math.log2(t1)
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable: tokens is inside the table")
