"""Command-line options shared by subcommands, and their conversion into specs (bytes in, GiB out)."""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

from layerslide.hwprofiles import HardwareProfile, parse_bytes, resolve_profile
from layerslide.planner import ModelSpec, Policy, TrainSpec, resolve_model
from layerslide.planner.plan import STEADY_STEPS
from layerslide.planner.settings import (
    ACCUMULATIONS,
    ACTIVATION_PLACEMENTS,
    CAST_MODES,
    CPU_OPTIMIZERS,
    GPU_UPDATE_ORDERS,
    LAYER_KERNEL_MODES,
    MOMENT_PRECISIONS,
    OPTIMIZER_ORDERS,
    ExecutorKnobs,
    run_ahead_from_env,
)

GIB = 1024**3


class UsageError(Exception):
    """Bad command-line input; main() prints it and exits with status 2."""


def gib(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / GIB


_NOT_GIVEN = object()


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> frozenset[str]:
    """The options argv gives (their dests), as the parser reads them (abbreviations and
    --flag=value included): told from those left at their defaults even where a user typed
    the default's value."""
    actions = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    saved = {a.dest: a.default for a in actions}
    parser.set_defaults(**dict.fromkeys(saved, _NOT_GIVEN))
    try:
        parsed = parser.parse_args(argv)
    finally:
        parser.set_defaults(**saved)
    return frozenset(dest for dest in saved if getattr(parsed, dest) is not _NOT_GIVEN)


def plan_settings(parser: argparse.ArgumentParser) -> list[str]:
    """The dests of a command's options that a plan holds: its training settings and policy
    (add_train's and add_policy's groups)."""
    return [a.dest for g in parser._action_groups if g.title in ("training settings", "policy")
            for a in g._group_actions]


def flag_of(dest: str) -> str:
    """The command-line flag of an option's dest."""
    return "--" + dest.replace("_", "-")


def given_as(args, dest: str) -> str:
    """The flag of an option the user gave, and where: typed, or in the --config file."""
    where = f" (in --config {args.config})" if dest in getattr(args, "from_config", ()) else ""
    return flag_of(dest) + where


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,2,4")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, e.g. 5")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def str_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names")
    return values


def profile_list(text: str) -> tuple[str, ...]:
    """Comma-separated profiles, a variant's own `,key=value` parts kept with it
    (`workstation-8ch+rtx5090,ram=512GiB,drives=4,h200-bench` is two profiles)."""
    profiles: list[str] = []
    for part in str_list(text):
        if "=" in part and profiles:
            profiles[-1] += f",{part}"
        elif "=" in part:
            raise argparse.ArgumentTypeError(f"{text!r}: {part} follows no profile (a variant "
                                             "is BASE[+CARD],key=value,...)")
        else:
            profiles.append(part)
    return tuple(profiles)


def byte_size(text: str) -> int:
    size = byte_size_or_zero(text)
    if size == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be more than 0 bytes")
    return size


def byte_size_or_zero(text: str) -> int:
    try:
        size = parse_bytes(text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if size < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be 0 bytes or more")
    return size


def byte_sizes(text: str) -> tuple[int, ...]:
    return tuple(byte_size(v) for v in str_list(text))


def add_model(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="preset name (see `layerslide models`) or a Hugging Face config.json "
                        "file or folder")


DEFAULT_PROFILE = "h200-bench"


def add_profile(p: argparse.ArgumentParser, default: str | None = DEFAULT_PROFILE) -> None:
    p.add_argument("--profile", default=default,
                   help="built-in hardware profile (see `layerslide profiles`) or a path to a "
                        f"TOML profile (default: {default or DEFAULT_PROFILE})")
    p.add_argument("--gpu-memory", type=byte_size, default=None, metavar="SIZE",
                   help="cap GPU memory, e.g. 24GiB (bytes; units B, KB, MB, GB, KiB, MiB, GiB...)")
    add_nvme_drives(p)


def add_nvme_drives(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nvme-drives", type=int, default=None, metavar="N",
                   help="the profile's NVMe drive N times over (the tier stripes its files "
                        "over one folder per drive: each drive's rates and capacity, N of "
                        "them; default: the profile's own count)")


def add_train(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training settings")
    g.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-batch")
    g.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--max-grad-norm", type=float, default=None,
                   help="global gradient-norm clipping threshold (off by default)")


def add_policy(p: argparse.ArgumentParser, *, plan_steps: bool = True) -> None:
    d = SimpleNamespace(**Policy.of().flat())  # the defaults by field name
    g = p.add_argument_group("policy")
    g.add_argument("--window", type=int, default=d.window,
                   help="decoder layers whose bf16 weights are on the GPU at once (cache units)")
    g.add_argument("--grad-buffers", type=int, default=d.grad_buffers,
                   help="layers whose bf16 grads may await their offload on the GPU at once")
    g.add_argument("--prefetch-depth", type=int, default=d.prefetch_depth,
                   help="layers ahead that a weight load may run (layer_major: blocks, each "
                        "a run of tasks), and GPU tasks ahead that an activation fetch may")
    g.add_argument("--activations", choices=ACTIVATION_PLACEMENTS, default=d.activations,
                   help="where per-layer checkpoints wait for backward")
    g.add_argument("--moments-on-nvme", type=float, default=d.moments_on_nvme,
                   help="fraction (0-1) of AdamW moments kept on NVMe")
    g.add_argument("--master-on-nvme", type=float, default=d.master_on_nvme,
                   help="fraction (0-1) of fp32 master weights kept on NVMe")
    g.add_argument("--weights-on-nvme", type=float, default=d.weights_on_nvme,
                   help="fraction (0-1) of the bf16 weights the GPU loads kept on NVMe (read "
                        "at each load, written with the state at each update; grads then land "
                        "in a pool of host buffers, 4 unless --host-grad-buffers says)")
    g.add_argument("--resident-layers", type=int, default=d.resident_layers,
                   help="decoder layers kept on the GPU outside the window")
    g.add_argument("--gpu-updated-blocks", type=int, default=d.gpu_updated_blocks,
                   help="blocks (embedding, layer 0, 1, ..., head) whose fp32 state stays on the "
                        "GPU and is updated there (18 B/param of GPU memory, no CPU work)")
    g.add_argument("--gpu-updated-order", choices=GPU_UPDATE_ORDERS, default=d.gpu_updated_order,
                   help="which blocks --gpu-updated-blocks takes first: the next forward's order "
                        "(embedding first) or the decoder layers first (leaves out a large "
                        "embedding)")
    g.add_argument("--optimizer-order", choices=OPTIMIZER_ORDERS, default=d.optimizer_order,
                   help="CPU runs ready optimizer steps by grad arrival or next-forward deadline")
    g.add_argument("--cast", choices=CAST_MODES, default=d.cast,
                   help="where fp32->bf16 happens: once per step on the CPU, per load on the CPU, "
                        "or on the GPU")
    g.add_argument("--cast-worker", action="store_true",
                   help="run casts on a CPU worker of their own, beside the optimizer's")
    g.add_argument("--head-loss", choices=("fused", "materialized"), default=d.head_loss,
                   help="fused linear cross-entropy or materialised logits")
    g.add_argument("--layer-kernels", choices=LAYER_KERNEL_MODES, default=d.layer_kernels,
                   help="compiled: decoder layers under torch.compile (fused RMSNorm, RoPE, "
                        "SwiGLU; ~25%% faster on the GPU); eager: Hugging Face's modules as is")
    g.add_argument("--host-grad-buffers", type=int, default=d.host_grad_buffers,
                   help="pinned host buffers that offloaded grads land in (default: one per "
                        "block; fewer saves RAM but makes the backward wait for the CPU)")
    g.add_argument("--cpu-optimizer", choices=CPU_OPTIMIZERS, default=d.cpu_optimizer,
                   help="native: one-pass AdamW on the landed bf16 grads that also writes the "
                        "bf16 weights (28 B/param of host traffic); torch: torch's fused AdamW "
                        "plus upcast and cast passes (40 B/param)")
    g.add_argument("--moment-precision", choices=MOMENT_PRECISIONS, default=d.moment_precision,
                   help="how AdamW's m and v are stored (master weights stay fp32): fp32; bf16, "
                        "rounded stochastically (4 B/param less RAM and 8 less host traffic); "
                        "int8, 8-bit codes with a scale per 2048 as 8-bit Adam keeps them (6 B "
                        "and 12 less). The compact ones change the numerics: opt-in")
    g.add_argument("--accumulation", choices=ACCUMULATIONS, default=d.accumulation,
                   help="with --grad-accum > 1: step_major runs each micro-batch through every "
                        "layer (weights reloaded per micro-batch, grads summed on the host); "
                        "layer_major runs each layer for all micro-batches while its weights "
                        "are loaded once (grads summed on the GPU, one offload per step)")
    g.add_argument("--sweep-groups", type=int, default=d.sweep_groups,
                   help="layer_major: the step's micro-batches run in at most this many groups, "
                        "a block's task running its group's in turn (fewer: a smaller plan, "
                        "quicker to simulate, more checkpoints fetched to the GPU at once)")
    if not plan_steps:
        return
    p.add_argument("--steps", type=int, default=STEADY_STEPS,
                   help=f"consecutive training steps to plan (simulate needs >= {STEADY_STEPS}: "
                        "the last cycle is the steady-state step it reports)")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (SI units: bytes, seconds)")


def model_of(args) -> ModelSpec:
    return resolve_model(args.model)


def profile_of(name: str, nvme_drives: int | None = None) -> HardwareProfile:
    """A profile by name or path, or a variant BASE[+CARD][,ram=SIZE][,drives=N][,nvme=SIZE]
    (hwprofiles.variants), with --nvme-drives applied where given."""
    profile = resolve_profile(name)
    if nvme_drives is None:
        return profile
    if ",drives=" in name and nvme_drives != profile.storage.drives:
        raise UsageError(f"--profile {name} names {profile.storage.drives} drives, and "
                         f"--nvme-drives {nvme_drives} another count: give it once")
    if nvme_drives < 1:
        raise UsageError(f"--nvme-drives {nvme_drives}: give a whole number of drives >= 1")
    return profile.with_overrides(nvme_drives=nvme_drives)


def train_of(args) -> TrainSpec:
    return TrainSpec(micro_batch=args.micro_batch, seq_len=args.seq_len,
                     grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm)


def policy_of(args) -> Policy:
    """The policy the flags say, with the executor settings the environment gives."""
    return with_env_overrides(Policy.of(
        window=args.window, grad_buffers=args.grad_buffers,
        prefetch_depth=args.prefetch_depth, activations=args.activations,
        moments_on_nvme=args.moments_on_nvme, master_on_nvme=args.master_on_nvme,
        weights_on_nvme=args.weights_on_nvme,
        resident_layers=args.resident_layers, gpu_updated_blocks=args.gpu_updated_blocks,
        gpu_updated_order=args.gpu_updated_order, optimizer_order=args.optimizer_order,
        cast=args.cast, cast_worker=args.cast_worker, head_loss=args.head_loss,
        layer_kernels=args.layer_kernels, host_grad_buffers=args.host_grad_buffers,
        cpu_optimizer=args.cpu_optimizer, accumulation=args.accumulation,
        sweep_groups=args.sweep_groups, moment_precision=args.moment_precision))


def with_env_overrides(policy: Policy) -> Policy:
    """The policy with the executor settings the environment gives (recorded in the plan that
    runs): LAYERSLIDE_RUN_AHEAD and ExecutorKnobs.from_env's variables, where they are set."""
    knobs = ExecutorKnobs.env_settings()  # only what the environment sets
    return policy.with_(stream_run_ahead=run_ahead_from_env(policy.schedule.stream_run_ahead),
                        **knobs)


def progress_printer(what: str):
    """A callback that redraws `what: done/total` on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r{what}: {done}/{total}", end=end, file=sys.stderr, flush=True)

    return show
