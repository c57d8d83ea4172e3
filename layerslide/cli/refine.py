"""`layerslide refine`: a profile's CPU AdamW rate set to the one a training run kept.

calibrate's AdamW test and the rate the same machine keeps inside training differ by up to
19% from one lent H200 to the next, by about the same on every run of a lease; the rate other
runs of the lease kept predicts a CPU-bound run better (15 -> 21 of 31 within target:
benchmarks/results/adamw_from_call_rows_2026-12-04). `train` writes both rates into its
prediction check: the simulator's for the decoder layers' AdamW with no copy beside it, and
the run's."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from layerslide.cli.options import UsageError, profile_of
from layerslide.cli.outputs import writable_file
from layerslide.reports.run_check import CHECK_FILE

# a ratio outside this says more about the run than about the machine's AdamW
PLAUSIBLE_RATIO = (0.5, 2.0)


def add_refine_command(sub, units: str) -> None:
    help = ("set a profile's CPU AdamW rate to the one a `layerslide train` run on this machine "
            "kept (from its --out folder), for simulate/tune/train --profile")
    p = sub.add_parser("refine", help=help, description=help, epilog=units)
    p.add_argument("--from-run", required=True, metavar="DIR",
                   help=f"the --out folder of a train run on this machine (its {CHECK_FILE}; "
                        "a few steps past the warm-up are enough)")
    p.add_argument("--out", required=True, help="profile file to write (.toml)")
    p.add_argument("--profile", help="the profile to refine (default: the one the run was "
                                     "predicted on)")
    p.add_argument("--name", help="the profile's name (default: the file's stem)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_refine)


def adamw_ratio(check: dict, source: str) -> float:
    """The run's AdamW rate alone over the one its prediction had (> 0)."""
    predicted = check.get("predicted_adamw_alone_params_per_s")
    measured = check.get("measured_adamw_alone_params_per_s")
    if not predicted or not measured:
        raise UsageError(f"{source} has no CPU AdamW rate of the run's decoder layers alone "
                         "(updated on the GPU, never without a copy beside them, or a run "
                         "too short): train a plan whose layers the CPU updates, 4 steps or "
                         "more")
    return measured / predicted


def cmd_refine(args) -> int:
    from layerslide.hwprofiles.writer import save_profile

    out = Path(args.out)
    if out.suffix != ".toml":
        raise UsageError(f"--out {out}: a profile file ends in .toml")
    writable_file("--out", args.out, overwrite=args.overwrite)
    source = Path(args.from_run).expanduser() / CHECK_FILE
    if not source.is_file():
        raise UsageError(f"--from-run {args.from_run}: no {CHECK_FILE} there: name the --out "
                         "folder of a finished `layerslide train` run")
    try:
        check = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"{source} cannot be read ({err}): train again") from err
    ratio = adamw_ratio(check, str(source))
    if not (args.profile or check.get("profile")):
        raise UsageError(f"{source} names no profile: pass --profile, the one the run used")
    profile = profile_of(args.profile or check["profile"])
    before = profile.host.adamw_params_per_s
    refined = profile.with_adamw_rate(
        before * ratio, f"refined from {source}: the run's decoder layers kept CPU AdamW alone "
                        f"at {ratio:.3f} x the rate predicted on {profile.name} "
                        f"({check['measured_adamw_alone_params_per_s'] / 1e9:.2f} against "
                        f"{check['predicted_adamw_alone_params_per_s'] / 1e9:.2f} Gparam/s)")
    save_profile(dataclasses.replace(refined, name=args.name or out.stem), out)
    if not PLAUSIBLE_RATIO[0] <= ratio <= PLAUSIBLE_RATIO[1]:  # the lent H200s: 0.83-1.14
        print(f"warning: the run kept {ratio:.2f} x the rate {profile.name} gives: a run on "
              "another machine than the profile's, or blocks too small for the rate to hold "
              "for a real model; check --profile and the run", file=sys.stderr)
    print(f"host.adamw_throughput {before / 1e9:.2f} -> "
          f"{refined.host.adamw_params_per_s / 1e9:.2f} Gparam/s ({ratio:.3f} x, as "
          f"{args.from_run} ran it; host memory bandwidth and the compact moments' rates with "
          f"it); wrote {out}: use it with --profile {out}")
    return 0
