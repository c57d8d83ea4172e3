"""`layerslide` console script: profiles, models, plan, simulate, tune, whatif, train, export,
calibrate, refine, demo."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from layerslide.cli import commands
from layerslide.cli.calibrate import add_calibrate_command
from layerslide.cli.demo import run_demo
from layerslide.cli.export import add_export_command
from layerslide.cli.options import (
    UsageError,
    add_field_flags,
    add_json,
    add_model,
    add_nvme_drives,
    add_policy,
    add_profile,
    add_train,
    byte_size,
    byte_sizes,
    given_options,
    in_flag_words,
    int_list,
    positive_int,
    profile_list,
    str_list,
)
from layerslide.cli.rank_output import errors
from layerslide.cli.refine import add_refine_command
from layerslide.cli.train import add_train_command
from layerslide.cli.tune import cmd_tune
from layerslide.cli.whatif import cmd_whatif
from layerslide.hwprofiles import builtin_card_names
from layerslide.hwprofiles.variants import SPEC_SYNTAX
from layerslide.outputs import writable_folder
from layerslide.planner.settings import MOMENT_PRECISIONS, TrainSpec
from layerslide.tuner import SearchSpace
from layerslide.tuner.purchase import DEFAULT_CARDS, DEFAULT_DRIVE_COUNTS, DEFAULT_PLATFORMS

UNITS = ("Units: sizes in bytes with a unit (24GiB = 24*2^30 B, 24GB = 24e9 B); times in seconds; "
         "rates per second; tables print GiB (2^30 B) and GB/s (1e9 B/s).")


WHATIF_EPILOG = (
    "Profiles: a name (`layerslide profiles`), a TOML file, or a variant "
    f"{SPEC_SYNTAX}, e.g. workstation-8ch+rtx5090,ram=512GiB,drives=4 (any command's --profile "
    "takes these). What to buy: whatif --model llama-3.1-70b --target-tokens-per-s 300 "
    "[--platforms ...] [--gpus ...] [--ram 128GiB,256GiB,512GiB] [--drives 1,2,4] [--out DIR]; "
    "costs add the profiles' [price] parts (GPU, platform, RAM per GB, drive), each a dated "
    "list price or the user's figure (edit a copy of a built-in profile to use yours).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="layerslide",
        description="Plan, simulate and tune full-parameter fine-tuning of LLMs larger than GPU "
                    "memory on one GPU (layers slide through a window of GPU memory).",
        epilog=UNITS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=UNITS)

    p = command("profiles", "list built-in hardware profiles")
    add_json(p)
    p.set_defaults(run=commands.cmd_profiles)

    p = command("models", "list built-in model presets")
    add_json(p)
    p.set_defaults(run=commands.cmd_models)

    p = command("plan", "build the task graph of training steps and summarise it")
    add_model(p)
    add_train(p)
    add_policy(p)
    add_json(p)
    p.add_argument("-o", "--output", help="write the plan as JSON to this file")
    p.set_defaults(run=commands.cmd_plan)

    p = command("simulate", "predict step time, throughput and peak memory of a plan")
    add_model(p, required=False)
    p.add_argument("--plan", help="a plan file from `plan -o` or `tune -o` instead of --model "
                                   "(its settings replace the training and policy flags); a "
                                   "tuned plan brings its profile and GPU cap as defaults")
    add_profile(p, default=None)
    add_train(p)
    add_policy(p)
    add_json(p)
    p.add_argument("--trace-out", help="write a Chrome/Perfetto trace JSON here")
    p.add_argument("--report-dir", help="write timeline and memory figures and traces here")
    p.set_defaults(run=commands.cmd_simulate)

    p = command("tune", "search settings and policy with the simulator under memory limits")
    add_model(p)
    add_profile(p)
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--max-grad-norm", type=float, default=None, help="clipping threshold")
    space = SearchSpace()

    def listed(values) -> str:
        return ",".join(str(v) for v in values)

    p.add_argument("--windows", type=int_list,
                   help=f"windows to try (default: {listed(space.windows)})")
    p.add_argument("--micro-batches", type=int_list,
                   help=f"micro-batches to try (default: {listed(space.micro_batches)})")
    p.add_argument("--grad-accums", type=int_list,
                   help=f"accumulation steps to try (default: {listed(space.grad_accums)})")
    p.add_argument("--accumulations", type=str_list,
                   help="with accumulation above 1, the schedules to try, of step_major,"
                        f"layer_major (default: both, step_major only up to "
                        f"x{space.step_major_max_accum}; named here: each at every accumulation)")
    p.add_argument("--max-tokens-per-step", type=int, default=None,
                   help="skip candidates of more tokens per step (micro-batch x sequence x "
                        f"accumulation x ranks; default {space.max_tokens_per_step}: 256 "
                        "sequences of 1k, a large fine-tuning batch, or the --data's tokens "
                        "where fewer); 0 for no cap")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="the training data (a file, folder or Hub dataset, as train's): a "
                        "step's tokens are capped at its tokens an epoch, counted with the "
                        "model's tokenizer (--model a folder or Hub id, or --tokenizer)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="with --data: the tokenizer folder (default: --model's folder)")
    p.add_argument("--activations", dest="activations_list", type=str_list,
                   help="checkpoint placements to try, of gpu,host,nvme "
                        f"(default: {listed(space.activations)})")
    p.add_argument("--casts", type=str_list, help="cast modes to try, of cpu_once,cpu_per_load,"
                                                  f"gpu (default: {listed(space.casts)})")
    p.add_argument("--optimizer-orders", type=str_list,
                   help=f"of arrival,deadline (default: {listed(space.optimizer_orders)})")
    p.add_argument("--moment-precisions", type=str_list,
                   help="how AdamW's moments may be stored, of fp32,bf16,int8 (default: "
                        f"{listed(space.moment_precisions)}; the compact ones change the "
                        "numerics, so they are tried only when named)")
    p.add_argument("--no-nvme", action="store_true", help="never place optimizer state on NVMe")
    p.add_argument("--no-gpu-updates", action="store_true",
                   help="do not fill free GPU memory with blocks updated on the GPU")
    # one rank is tuned on its share of the host; tokens/s and the token cap are every rank's
    add_field_flags(p.add_argument_group("ranks"), TrainSpec, only=("gpus", "hosts"))
    p.add_argument("--top", type=positive_int, default=5, help="how many of the best to print")
    p.add_argument("--exhaustive", action="store_true",
                   help="simulate every candidate (the search before bounds: minutes on large "
                        "models; the default simulates only those whose bound can beat the "
                        "best and picks the same)")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="PCT",
                   help="also skip candidates that could beat the best by no more than PCT "
                        "percent (default 0: the exhaustive search's pick; 0.5 is faster, "
                        "within 0.5%% of it)")
    p.add_argument("-o", "--output", help="write the best plan to this file")
    add_json(p)
    p.set_defaults(run=cmd_tune)

    p = command("whatif", "what fits and how fast: one model across profiles, one profile "
                          "across models and RAM/NVMe sizes, or what to buy for a target "
                          "throughput (--target-tokens-per-s)")
    p.epilog = WHATIF_EPILOG + " " + UNITS
    add_model(p, required=False)
    p.add_argument("--profiles", type=profile_list,
                   help="profiles to compare (default: all built-in); each a name, a file or a "
                        f"variant {SPEC_SYNTAX}")
    p.add_argument("--on-profile", dest="profile_axis",
                   help="instead: this profile across --models (default: all presets)")
    p.add_argument("--models", type=str_list, help="models to compare with --on-profile")
    p.add_argument("--ram", type=byte_sizes, help="RAM sizes to try, e.g. 128GiB,256GiB")
    p.add_argument("--nvme", type=byte_sizes, help="NVMe capacities to try, e.g. 1TB,4TB")
    p.add_argument("--gpu-memory", type=byte_size, default=None, metavar="SIZE",
                   help="cap GPU memory, e.g. 24GiB")
    add_nvme_drives(p)
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--moment-precision", choices=MOMENT_PRECISIONS, default="fp32",
                   help="how AdamW's moments are stored in the configurations tried (fp32, "
                        "bf16 or int8); --on-profile also bounds the largest model by each")
    p.add_argument("--gpu-counts", type=int_list, default=None, metavar="N,...",
                   help="instead of one GPU per profile: each profile at each of these GPU "
                        "counts per host, one rank each, e.g. 1,2,4,8 (default profiles: the "
                        "built-in hosts of several GPUs); rows say tokens/s over every rank, "
                        "the speedup over the profile's one GPU and what bounds each")
    p.add_argument("--host-counts", type=int_list, default=None, metavar="M,...",
                   help="with --gpu-counts: each at these host counts too, e.g. 1,2 (profiles "
                        "with a [network] table)")
    p.add_argument("--exhaustive", action="store_true",
                   help="tune each row over its whole space (see tune --exhaustive)")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="PCT",
                   help="each row within PCT percent of its best (see tune --tolerance)")
    g = p.add_argument_group(
        "what to buy (--target-tokens-per-s with --model)",
        "every variant PLATFORM+CARD,ram=SIZE,drives=N in the ranges below, tuned for the "
        "model in a coarse search space; --ram gives the RAM sizes to try")
    g.add_argument("--target-tokens-per-s", type=float, default=None, metavar="T",
                   help="the throughput to reach: list the variants that reach it, cheapest "
                        "first, with what bounds each and how far the next cheaper falls short")
    g.add_argument("--platforms", type=str_list, default=None,
                   help=f"base profiles to try (default: {','.join(DEFAULT_PLATFORMS)})")
    g.add_argument("--gpus", type=str_list, default=None,
                   help=f"GPU cards of hwprofiles/builtin/gpus to try (default: "
                        f"{','.join(DEFAULT_CARDS)}; all: {','.join(builtin_card_names())})")
    g.add_argument("--drives", type=int_list, default=None,
                   help="NVMe drive counts to try (default: "
                        f"{','.join(str(n) for n in DEFAULT_DRIVE_COUNTS)})")
    g.add_argument("--workers", type=int, default=None,
                   help="variants tuned at once, each in its own process (default: the CPUs)")
    g.add_argument("--csv", default=None, metavar="FILE", help="also write the rows as CSV")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="write purchase.png (tokens/s against cost), purchase.csv, "
                        "purchase.json and summary.txt here")
    add_json(p)
    p.set_defaults(run=cmd_whatif)

    add_train_command(sub, UNITS)
    add_export_command(sub, UNITS)
    add_calibrate_command(sub, UNITS)
    add_refine_command(sub, UNITS)

    p = command("demo", "plan + simulate + tune + what-if for Llama-3.2-3B on the H200 profile, "
                        "written to a report folder")
    p.add_argument("--out", default="layerslide-report", help="report folder (default: %(default)s)")
    p.add_argument("--exhaustive", action="store_true",
                   help="tune over every candidate (see tune --exhaustive): slower, the same "
                        "picks")
    p.set_defaults(run=run_demo_command)
    return parser


def run_demo_command(args) -> int:
    if not args.out.strip():
        raise UsageError("--out is empty: give the report folder, e.g. layerslide-report")
    writable_folder("--out", args.out)  # a report folder is written into, kept files and all
    readme = run_demo(Path(args.out), log=lambda msg: print(msg, flush=True),
                      exhaustive=args.exhaustive)
    print(f"report written to {readme.parent.resolve()} (start with {readme.name})")
    return 0


def _subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (train --config re-parses them)
    args.parser = _subcommand_parser(parser, args.command)
    args.given = given_options(args.parser, args.argv[1:])
    try:
        return args.run(args)
    except (UsageError, ValueError) as err:  # bad input says what to change (house style)
        print(f"layerslide {args.command}: error: "
              f"{in_flag_words(str(err), args.parser, getattr(args, 'given', ()))}",
              file=errors())  # (a rank but the first of several: prefixed with its rank)
        return 2
    except KeyboardInterrupt:  # before training (which stops gracefully) or outside it
        print(f"layerslide {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
