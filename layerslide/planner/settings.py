"""TrainSpec (what to train on) and Policy (how to slide the window): validated once, here."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Literal, get_args, get_type_hints

# GPU bytes one chunk of the fused head's bf16 logits may take by default (head_chunk_bytes):
# at a 128k vocab, 4k-row chunks
HEAD_CHUNK_LOGIT_BYTES = 1 << 30

# Each choice is a Literal type (for readers, type checkers and a flag's choices) and its tuple
# of values (what __post_init__ checks), the one made from the other.
ActivationPlacement = Literal["gpu", "host", "nvme"]
ACTIVATION_PLACEMENTS = get_args(ActivationPlacement)
OptimizerOrder = Literal["arrival", "deadline"]
OPTIMIZER_ORDERS = get_args(OptimizerOrder)
# cpu_once: cast fp32->bf16 once per step into a persistent pinned bf16 copy (2 B/param of RAM);
# cpu_per_load: cast into a shared staging buffer before every load, as the published system does;
# gpu: send fp32 over PCIe (twice the bytes) and cast on the GPU.
CastMode = Literal["cpu_once", "cpu_per_load", "gpu"]
CAST_MODES = get_args(CastMode)
HeadLoss = Literal["fused", "materialized"]
HEAD_LOSS_MODES = get_args(HeadLoss)
# compiled: decoder layers under torch.compile (fused elementwise kernels); eager: HF's modules
LayerKernels = Literal["compiled", "eager"]
LAYER_KERNEL_MODES = get_args(LayerKernels)
# native: layerslide's one-pass AdamW that reads the landed bf16 grads and (cast=cpu_once) writes
# the bf16 weights itself, no separate cast task; torch: torch's fused AdamW, which needs fp32
# grads (an upcast pass) and a cast pass after it.
CpuOptimizer = Literal["native", "torch"]
CPU_OPTIMIZERS = get_args(CpuOptimizer)
# The CPU kernels' workers' niceness that lets the lanes' threads take a core first: a GPU-bound
# plan's dispatch stops queueing behind AdamW (H200: Qwen3-4B layer-major -25% step time); a
# CPU-bound one moved -3% to +8%, so it keeps 0 (benchmarks/results/archive/validation_2026-12-04c)
LANES_FIRST_NICE = 19
# How the executor's lanes learn that GPU work they wait for is done (ExecutorKnobs.lane_waits)
LaneWaits = Literal["poll", "watch"]
LANE_WAITS = get_args(LaneWaits)
# Which blocks gpu_updated_blocks takes first: the next forward's order (the embedding, layer 0,
# 1, ..., the head), or the decoder layers first (layer 0, 1, ..., the head, the embedding),
# which leaves out a large embedding (Llama-3.2-3B's: 0.39 B parameters, 6.6 GiB of GPU state)
GpuUpdateOrder = Literal["forward", "layers_first"]
GPU_UPDATE_ORDERS = get_args(GpuUpdateOrder)
# How a step of several micro-batches runs. step_major: each micro-batch passes through every
# layer in turn, so every micro-batch loads every layer's weights again and its grads are
# summed in fp32 on the host. layer_major: each layer runs forward (then backward) for all of
# the step's micro-batches while its weights are loaded once; its grads are summed in fp32 on
# the GPU and offloaded once per step, as without accumulation.
Accumulation = Literal["step_major", "layer_major"]
ACCUMULATIONS = get_args(Accumulation)
# How AdamW's m and v are stored (master weights stay fp32): fp32; bf16, rounded
# stochastically; int8, 8-bit codes with a fp32 scale per MOMENT_BLOCK_ELEMENTS as 8-bit Adam
# keeps them (executor/moments.py). The compact ones change the numerics: opt-in.
MomentPrecision = Literal["fp32", "bf16", "int8"]
MOMENT_PRECISIONS = get_args(MomentPrecision)
MOMENT_BLOCK_ELEMENTS = 2048  # elements per scale of 8-bit moments (csrc/adamw.c's MOMENT_BLOCK)


def moments_nbytes(numel: int, precision: MomentPrecision) -> int:
    """Bytes of the m and v of numel parameters in a precision (8-bit: codes and scales)."""
    if precision == "int8":
        return 2 * numel + 8 * -(-numel // MOMENT_BLOCK_ELEMENTS)
    return (4 if precision == "bf16" else 8) * numel


def disk_cut(numel: int, fraction: float, precision: MomentPrecision) -> int:
    """How many of a block's first numel elements a fraction of it puts on the drive: 8-bit
    moments are cut at whole scale blocks, so every cut of a block's state is."""
    if precision != "int8":
        return round(fraction * numel)
    whole = round(fraction * numel / MOMENT_BLOCK_ELEMENTS) * MOMENT_BLOCK_ELEMENTS
    return numel if fraction == 1.0 else min(whole, numel)


def setting(default, doc: str):
    """A field with its doc beside it: where the field is a command-line flag, the doc is the
    flag's help (plain text: cli.options escapes it for argparse)."""
    return field(default=default, metadata={"doc": doc})


def doc_of(f: Field) -> str | None:
    """A field's doc as setting() gave it (None: declared without one)."""
    return f.metadata.get("doc")


def _fail(owner: str, name: str, value: object, what: str) -> None:
    raise ValueError(f"{owner}.{name}={value!r}: {what}")


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """Per-step training shape: micro-batch, sequence length, accumulation, clipping."""

    micro_batch: int = setting(8, "sequences per micro-batch")
    seq_len: int = setting(1024, "tokens per sequence")
    grad_accum: int = setting(1, "micro-batches per optimizer step")
    # Global gradient-norm clipping needs every gradient before any update: the plan makes
    # every optimizer step of a step wait for all gradients to land.
    max_grad_norm: float | None = setting(
        None, "global gradient-norm clipping threshold (off by default)")
    # Data-parallel ranks: every rank runs the same plan on its own micro-batches; a host's
    # ranks shard its one copy of the state between them (planner/sharding.py), and each host
    # holds a copy. micro_batch and grad_accum stay per rank.
    gpus: int = setting(1, "GPUs per host, one rank each; they share the host's one copy of "
                           "the optimizer state")
    hosts: int = setting(1, "hosts, each with gpus ranks and a copy of the optimizer state")

    def __post_init__(self) -> None:
        _positive("TrainSpec", self, "micro_batch", "seq_len", "grad_accum", "gpus", "hosts")
        if self.max_grad_norm is not None and not 0 < self.max_grad_norm < math.inf:
            _fail("TrainSpec", "max_grad_norm", self.max_grad_norm,
                  "must be a finite threshold > 0, or None (off)")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        """One rank's tokens of a step."""
        return self.tokens_per_micro_batch * self.grad_accum

    @property
    def ranks(self) -> int:
        return self.gpus * self.hosts

    @property
    def global_tokens_per_step(self) -> int:
        """Every rank's tokens of a step: what one optimizer step learns from."""
        return self.tokens_per_step * self.ranks

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainSpec:
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class ExecutorKnobs:
    """How the executor runs a plan, not what it computes: kept in the plan (Policy.executor) so
    that a run is reproducible from its file. At the command line the environment sets them
    (from_env). The simulator prices one: cpu_nice at LANES_FIRST_NICE (lanes_first) against
    0; other niceness it prices as 0, and the other knobs not at all."""

    cpu_threads: int = 0  # threads of the native CPU AdamW and cast (0: OpenMP's, every core)
    cpu_chunk_elements: int = 1 << 20  # elements a thread takes at a time (0: one even slice)
    lane_switch_interval_s: float = 2e-4  # Python's GIL switch interval while the lanes run
    # niceness of the native kernels' worker threads (0: the process's); LANES_FIRST_NICE
    # where the plan is GPU-bound (train and tune set it: tuner.lanes_first)
    cpu_nice: int = 0
    # how lanes learn that GPU work they wait for is done: "poll" its events every 0.2 ms, or
    # "watch": a thread per stream lane sleeps on each event in turn and wakes the waiters
    lane_waits: LaneWaits = "poll"

    @property
    def lanes_first(self) -> bool:
        """The CPU kernels' workers yield a core to the lane threads as they wake (the
        simulator prices the launches beside them with host.kernel_launch_beside_niced_kernels)."""
        return self.cpu_nice == LANES_FIRST_NICE

    def __post_init__(self) -> None:
        _whole("ExecutorKnobs", self, "cpu_threads", "cpu_chunk_elements", "cpu_nice")
        _chosen("ExecutorKnobs", self, lane_waits=LANE_WAITS)
        if self.cpu_nice > 19:
            _fail("ExecutorKnobs", "cpu_nice", self.cpu_nice, "must lie in 0..19 (Linux nice)")
        if not self.lane_switch_interval_s > 0:
            _fail("ExecutorKnobs", "lane_switch_interval_s", self.lane_switch_interval_s,
                  "must be > 0 seconds")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ExecutorKnobs:
        """The knobs with LAYERSLIDE_CPU_THREADS, LAYERSLIDE_CPU_CHUNK, LAYERSLIDE_CPU_NICE,
        LAYERSLIDE_LANE_SWITCH_INTERVAL_S and LAYERSLIDE_LANE_WAITS applied where they are
        set."""
        return cls(**cls.env_settings(environ))

    @staticmethod
    def env_settings(environ: Mapping[str, str] = os.environ) -> dict:
        """The knobs those variables set, by field name: only the variables that are set."""
        given, hints = {}, get_type_hints(ExecutorKnobs)
        for name in (f.name for f in fields(ExecutorKnobs)):
            var, kind = FROM_ENVIRONMENT[name], hints[name] if hints[name] in (int, float) else str
            raw = environ.get(var, "").strip()
            if not raw:
                continue
            try:
                given[name] = kind(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r}: must be a "
                                 f"{'whole number >= 0' if kind is int else 'number of seconds'}"
                                 ) from None
        ExecutorKnobs(**given)  # checked here, at the boundary
        if environ.get("LAYERSLIDE_CPU_SCHED", "").strip():
            _, why = RETIRED_FIELDS["executor", "cpu_sched"]
            warnings.warn(f"LAYERSLIDE_CPU_SCHED is ignored: removed, since {why}",
                          stacklevel=2)
        return given


def run_ahead_from_env(default: int, environ: Mapping[str, str] = os.environ) -> int:
    """Policy.schedule.stream_run_ahead as LAYERSLIDE_RUN_AHEAD sets it, else `default`."""
    var = FROM_ENVIRONMENT["stream_run_ahead"]
    raw = environ.get(var, "").strip()
    if not raw:
        return default
    try:
        tasks = int(raw)
    except ValueError:
        tasks = -1
    if tasks < 0:
        raise ValueError(f"{var}={raw!r}: give a whole number of tasks >= 1 "
                         "(0: no bound)")
    return tasks


def _positive(owner: str, self, *names: str) -> None:
    for name in names:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(owner, name, value, "must be a positive integer")


def _whole(owner: str, self, *names: str) -> None:
    for name in names:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            _fail(owner, name, value, "must be an integer >= 0")


def _chosen(owner: str, self, **choices: tuple[str, ...]) -> None:
    for name, allowed in choices.items():
        if getattr(self, name) not in allowed:
            _fail(owner, name, getattr(self, name), f"choose one of {', '.join(allowed)}")


# Residency fields that say where on the drive a block's state lies: a checkpoint's RAM parts
# are sized by them, so a resumed run keeps them.
STATE_LAYOUT_FIELDS = ("master_on_nvme", "moments_on_nvme", "weights_on_nvme",
                       "moment_precision")


@dataclass(frozen=True, kw_only=True)
class Residency:
    """Where state lives and how much of it at once: the window of weights on the GPU, blocks
    kept or updated there, checkpoints, the NVMe tier's share, grads awaiting their offload."""

    window: int = setting(
        2, "decoder layers whose bf16 weights are on the GPU at once (cache units)")
    resident_layers: int = setting(0, "decoder layers kept on the GPU outside the window")
    # Blocks whose fp32 master weights, AdamW moments and grads live on the GPU and are updated
    # there (fused AdamW): the first gpu_updated_blocks of gpu_updated_order's sequence,
    # updated in the order the next forward needs them. They never cross PCIe and cost the CPU
    # nothing: GPU memory (sizes.GPU_UPDATED_BYTES_PER_PARAM) buys CPU time.
    gpu_updated_blocks: int = setting(
        0, "blocks (embedding, layer 0, 1, ..., head) whose fp32 state stays on the GPU and is "
           "updated there (18 B/param of GPU memory, no CPU work)")
    gpu_updated_order: GpuUpdateOrder = setting(
        "forward", "which blocks --gpu-updated-blocks takes first: the next forward's order "
                   "(embedding first) or the decoder layers first (leaves out a large embedding)")
    activations: ActivationPlacement = setting(
        "host", "where per-layer checkpoints wait for backward")
    master_on_nvme: float = setting(0.0, "fraction (0-1) of fp32 master weights kept on NVMe")
    moments_on_nvme: float = setting(0.0, "fraction (0-1) of AdamW moments kept on NVMe")
    weights_on_nvme: float = setting(
        0.0, "fraction (0-1) of the bf16 weights the GPU loads kept on NVMe (read at each load, "
             "written with the state at each update; grads then land in a pool of host "
             "buffers, 4 unless --host-grad-buffers says)")
    grad_buffers: int = setting(
        2, "layers whose bf16 grads may await their offload on the GPU at once")
    # Pinned host buffers that offloaded grads land in; when all wait for the CPU, the next
    # offload waits (backpressure on the backward). None: one per block, so the backward never
    # waits and a CPU-bound step can update deadline-first. Clipping always uses one per block.
    # Not used where grads land in the blocks' upload buffers (grads_land_in_upload); with
    # weights on NVMe, None is BOUNDED_LANDING_BUFFERS (landing_buffers).
    host_grad_buffers: int | None = setting(
        None, "pinned host buffers that offloaded grads land in (default: one per block; fewer "
              "saves RAM but makes the backward wait for the CPU)")
    moment_precision: MomentPrecision = setting(
        "fp32", "how AdamW's m and v are stored (master weights stay fp32): fp32; bf16, rounded "
                "stochastically (4 B/param less RAM and 8 less host traffic); int8, 8-bit codes "
                "with a scale per 2048 as 8-bit Adam keeps them (6 B and 12 less). The compact "
                "ones change the numerics: opt-in")

    @property
    def state_on_nvme(self) -> bool:
        """Part of some block's master weights, moments or bf16 weights lives on NVMe."""
        return self.moments_on_nvme > 0 or self.master_on_nvme > 0 or self.weights_on_nvme > 0

    @property
    def uses_nvme(self) -> bool:
        """The run needs an NVMe folder: state or activation checkpoints there."""
        return self.state_on_nvme or self.activations == "nvme"

    def __post_init__(self) -> None:
        _positive("Policy", self, "window", "grad_buffers")
        _whole("Policy", self, "resident_layers", "gpu_updated_blocks")
        if self.host_grad_buffers is not None and (
                not isinstance(self.host_grad_buffers, int) or self.host_grad_buffers < 1):
            _fail("Policy", "host_grad_buffers", self.host_grad_buffers,
                  "must be a positive integer, or None for one per block")
        _chosen("Policy", self, activations=ACTIVATION_PLACEMENTS,
                gpu_updated_order=GPU_UPDATE_ORDERS, moment_precision=MOMENT_PRECISIONS)
        for name in ("master_on_nvme", "moments_on_nvme", "weights_on_nvme"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                _fail("Policy", name, value, "must be a fraction in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """In what order and how far ahead the work runs: prefetch, the CPU's order, the cast."""

    prefetch_depth: int = setting(
        1, "layers ahead that a weight load may run (layer_major: blocks, each a run of tasks), "
           "and GPU tasks ahead that an activation fetch may")
    nvme_prefetch: int = 2  # optimizer-state reads that may run ahead of the CPU
    optimizer_order: OptimizerOrder = setting(
        "deadline", "CPU runs ready optimizer steps by grad arrival or next-forward deadline")
    cast: CastMode = setting(
        "cpu_once", "where fp32->bf16 happens: once per step on the CPU, per load on the CPU, "
                    "or on the GPU")
    # A cast worker and the optimizer's then share host memory bandwidth and the cores instead
    # of taking turns.
    cast_worker: bool = setting(
        False, "run casts on a CPU worker of their own, beside the optimizer's")
    # How many of its tasks a stream lane's host thread may have queued on the GPU, unfinished,
    # before it waits to enqueue the next (0: no bound): unbounded, a tensor handed to another
    # stream stays held by the caching allocator until that stream has done all queued at its
    # free (benchmarks/results/archive/validation_2026-11-30b). The simulator models the same bound.
    stream_run_ahead: int = 3
    accumulation: Accumulation = setting(
        "step_major", "with --grad-accum > 1: step_major runs each micro-batch through every "
                      "layer (weights reloaded per micro-batch, grads summed on the host); "
                      "layer_major runs each layer for all micro-batches while its weights are "
                      "loaded once (grads summed on the GPU, one offload per step)")
    # More groups: finer overlap.
    sweep_groups: int = setting(
        8, "layer_major: the step's micro-batches run in at most this many groups, a block's "
           "task running its group's in turn (fewer: a smaller plan, quicker to simulate, more "
           "checkpoints fetched to the GPU at once)")

    def __post_init__(self) -> None:
        _positive("Policy", self, "prefetch_depth", "nvme_prefetch", "sweep_groups")
        _whole("Policy", self, "stream_run_ahead")
        _chosen("Policy", self, optimizer_order=OPTIMIZER_ORDERS, cast=CAST_MODES,
                accumulation=ACCUMULATIONS)


@dataclass(frozen=True, kw_only=True)
class Kernels:
    """Which kernels do the work: the layers', the head's loss, the CPU optimizer."""

    layer_kernels: LayerKernels = setting(
        "compiled", "compiled: decoder layers under torch.compile (fused RMSNorm, RoPE, SwiGLU; "
                    "~25% faster on the GPU); eager: Hugging Face's modules as is")
    head_loss: HeadLoss = setting(
        "fused", "fused linear cross-entropy or materialised logits")
    # GPU bytes of one chunk of the fused head's bf16 logits: smaller chunks hold less at the
    # head and leave smaller holes in the allocator's cache, for a slower head
    # (benchmarks/results/kernels_2026-11-29/head_bench.md)
    head_chunk_bytes: int = HEAD_CHUNK_LOGIT_BYTES
    cpu_optimizer: CpuOptimizer = setting(
        "native", "native: one-pass AdamW on the landed bf16 grads that also writes the bf16 "
                  "weights (28 B/param of host traffic); torch: torch's fused AdamW plus upcast "
                  "and cast passes (40 B/param)")

    def __post_init__(self) -> None:
        if (not isinstance(self.head_chunk_bytes, int) or isinstance(self.head_chunk_bytes, bool)
                or self.head_chunk_bytes < 2**20):
            _fail("Policy", "head_chunk_bytes", self.head_chunk_bytes,
                  "must be a whole number of bytes >= 1 MiB")
        _chosen("Policy", self, layer_kernels=LAYER_KERNEL_MODES, head_loss=HEAD_LOSS_MODES,
                cpu_optimizer=CPU_OPTIMIZERS)


# Policy's groups by attribute, in the order --help lists their flags
POLICY_GROUPS = {"residency": Residency, "schedule": Schedule, "kernels": Kernels,
                 "executor": ExecutorKnobs}
_GROUP_OF = {f.name: group for group, cls in POLICY_GROUPS.items() for f in fields(cls)}

# What sets each field from outside the code. Every field of TrainSpec and of Policy's groups is
# a command-line flag (plan, simulate, train; its doc is its help) but those named here:
# the executor's settings, which the environment sets, by these variables (how a plan runs, not
# what it computes: recorded in the plan that runs)...
FROM_ENVIRONMENT = {
    "cpu_threads": "LAYERSLIDE_CPU_THREADS",
    "cpu_chunk_elements": "LAYERSLIDE_CPU_CHUNK",
    "cpu_nice": "LAYERSLIDE_CPU_NICE",
    "lane_switch_interval_s": "LAYERSLIDE_LANE_SWITCH_INTERVAL_S",
    "lane_waits": "LAYERSLIDE_LANE_WAITS",
    "stream_run_ahead": "LAYERSLIDE_RUN_AHEAD",
}
# ...and those no one sets at the command line, with who does.
NOT_ON_COMMAND_LINE = {
    "nvme_prefetch": "tune's NVMe search (tuner/placement.py)",
    "head_chunk_bytes": "a plan file, or a Policy made in code (benchmarks' cases)",
}


def flag_fields(cls: type) -> tuple[Field, ...]:
    """The fields of TrainSpec or of one of Policy's groups that are command-line flags, in
    their declared order: a new field is one unless named above."""
    return tuple(f for f in fields(cls)
                 if f.name not in FROM_ENVIRONMENT and f.name not in NOT_ON_COMMAND_LINE)


def policy_flag_fields() -> tuple[Field, ...]:
    """The Policy fields that are command-line flags, group by group."""
    return tuple(f for cls in POLICY_GROUPS.values() for f in flag_fields(cls))


@dataclass(frozen=True, kw_only=True)
class Policy:
    """How the GPU window slides over the layers and where state lives, by concern: residency
    and schedule shape the plan, kernels choose the code that runs it, executor says how the
    executor runs it (not what it computes). Policy.of(window=4, cast="gpu") takes the fields
    by name; policy.with_(...) changes some."""

    residency: Residency = field(default_factory=Residency)
    schedule: Schedule = field(default_factory=Schedule)
    kernels: Kernels = field(default_factory=Kernels)
    executor: ExecutorKnobs = field(default_factory=ExecutorKnobs)

    @classmethod
    def of(cls, **settings) -> Policy:
        """A policy from its fields by name, each into its group; the rest as defaults."""
        unknown = sorted(set(settings) - set(_GROUP_OF))
        if unknown:
            raise ValueError(f"unknown policy fields {unknown}; known: {sorted(_GROUP_OF)}")
        groups = {g: {} for g in POLICY_GROUPS}
        for name, value in settings.items():
            groups[_GROUP_OF[name]][name] = value
        return cls(**{g: POLICY_GROUPS[g](**given) for g, given in groups.items()})

    def with_(self, **changes) -> Policy:
        """This policy with some fields (by name) changed."""
        return Policy.of(**{**self.flat(), **changes})

    def flat(self) -> dict:
        """Every field by name (the groups' fields, one level)."""
        return {name: getattr(getattr(self, group), name) for name, group in _GROUP_OF.items()}

    @property
    def optimizer_casts(self) -> bool:
        """The CPU optimizer step writes the bf16 upload copy itself (no cast tasks)."""
        return self.schedule.cast == "cpu_once" and self.kernels.cpu_optimizer == "native"

    @property
    def cpu_casts(self) -> bool:
        """The plan has fp32->bf16 cast tasks on the CPU (what a cast worker runs)."""
        return self.schedule.cast != "gpu" and not self.optimizer_casts

    def __post_init__(self) -> None:
        for group, cls in POLICY_GROUPS.items():
            if not isinstance(getattr(self, group), cls):
                _fail("Policy", group, getattr(self, group), f"must be a {cls.__name__}")
        window, depth = self.residency.window, self.schedule.prefetch_depth
        if depth > window:
            _fail("Policy", "prefetch_depth", depth,
                  f"cannot exceed window={window}: a prefetched layer needs a free cache unit")
        if self.schedule.cast in ("gpu", "cpu_per_load") and self.residency.master_on_nvme > 0:
            _fail("Policy", "cast", self.schedule.cast,
                  "this cast reads fp32 master weights from RAM at every load: set "
                  "master_on_nvme=0 or use cast=cpu_once")
        if (self.residency.moment_precision != "fp32"
                and self.kernels.cpu_optimizer != "native"):
            _fail("Policy", "moment_precision", self.residency.moment_precision,
                  "compact moments are read and written by layerslide's native CPU AdamW: use "
                  "cpu_optimizer=native, or moment_precision=fp32")
        if self.residency.weights_on_nvme > 0 and not self.optimizer_casts:
            _fail("Policy", "weights_on_nvme", self.residency.weights_on_nvme,
                  "the bf16 weights on NVMe are written by the native CPU AdamW itself: use "
                  "cast=cpu_once with cpu_optimizer=native, or weights_on_nvme=0")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Policy:
        """From to_dict's nested form, or the flat one that checkpoints written before the
        groups existed hold. Fields since removed (RETIRED_FIELDS) are dropped: they changed
        how fast a run went, never what it computed."""
        if not set(data) <= set(POLICY_GROUPS):  # flat
            return cls.of(**data)
        data = dict(data)
        for group, given in data.items():
            if isinstance(given, dict):  # (anything else is refused below)
                data[group] = {k: v for k, v in given.items() if (group, k) not in RETIRED_FIELDS}
                for name in set(given) - set(data[group]):
                    _warn_retired(group, name, given[name])
        unknown = sorted(f"{g}.{k}" for g, given in data.items() for k in given
                         if _GROUP_OF.get(k) != g)
        if unknown:
            raise ValueError(f"unknown policy fields {unknown}; known: {sorted(_GROUP_OF)}")
        return cls(**{g: POLICY_GROUPS[g](**given) for g, given in data.items()})


# (group, field) -> (the value that is now the only behaviour, why the field went)
RETIRED_FIELDS = {("executor", "cpu_sched"): (
    "normal", ("SCHED_BATCH workers ran no faster than normal ones on the H200 "
               "(benchmarks/results/archive/validation_2026-12-04c)"))}


def _warn_retired(group: str, name: str, value) -> None:
    """A saved policy's removed field, dropped: a warning where it asked for other than what
    now always happens (pointing at Policy.from_dict's caller)."""
    kept, why = RETIRED_FIELDS[group, name]
    if value != kept:
        warnings.warn(f"policy field {group}.{name}={value!r} is ignored: removed, since {why}; "
                      f"runs now always use {kept!r}", stacklevel=3)


def sums_grads_on_host(policy: Policy, train: TrainSpec) -> bool:
    """The micro-batches' grads are offloaded one by one and summed in fp32 on the host
    (step-major accumulation); otherwise each block's grads cross to the host once per step."""
    return train.grad_accum > 1 and policy.schedule.accumulation == "step_major"


def sweep_group_sizes(policy: Policy, train: TrainSpec) -> tuple[int, ...]:
    """How many micro-batches each task of a sweep runs: one sweep's groups, in order (one
    group of one under step-major accumulation)."""
    if policy.schedule.accumulation != "layer_major":
        return (1,)
    groups = min(policy.schedule.sweep_groups, train.grad_accum)
    size = -(-train.grad_accum // groups)
    return tuple(min(size, train.grad_accum - first) for first in range(0, train.grad_accum, size))


# A bounded pool of landing buffers: few enough to bound the grads waiting for a slow
# optimizer, enough to keep the backward streaming. The pool where part of the upload copy is
# on NVMe and the policy names none (one buffer per block would take back the RAM it saves),
# and the one tune falls back to when the host overflows.
BOUNDED_LANDING_BUFFERS = 4


def landing_buffers(policy: Policy) -> int | None:
    """The pool of landing buffers the policy asks for (None: one per block)."""
    if policy.residency.host_grad_buffers is None and policy.residency.weights_on_nvme > 0:
        return BOUNDED_LANDING_BUFFERS
    return policy.residency.host_grad_buffers


def grads_land_in_upload(policy: Policy, train: TrainSpec) -> bool:
    """Offloaded bf16 grads land in their block's bf16 upload copy, which needs no buffer of
    their own (2 B/param of pinned RAM saved). That copy is dead from the step's last load of
    the block (which the block's backward, hence its grads, must follow) until the optimizer
    step writes the new weights into it, after reading the grads element by element. It exists
    with cast=cpu_once; with step-major accumulation a step loads each block again after grads
    have landed, so those keep landing buffers; with part of the copy on NVMe, so do they."""
    return (policy.schedule.cast == "cpu_once" and not sums_grads_on_host(policy, train)
            and policy.residency.weights_on_nvme == 0)
