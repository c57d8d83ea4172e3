"""`layerslide refine`: a profile's CPU AdamW rate set to the one a training run kept.

On the lent H200s the rate AdamW kept inside training strayed from calibrate's test by more
than the CPU-bound target, and the rate other runs of the lease kept predicted a CPU-bound run
better (benchmarks/results/archive/adamw_from_call_rows_2026-12-04). `train` writes what refine
reads into its prediction check: the decoder layers' AdamW with no copy beside it, predicted
and measured, and the profile's figure the prediction used."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from layerslide.cli.options import UsageError, profile_of
from layerslide.outputs import writable_file
from layerslide.reports.run_check import CHECK_FILE, WARMUP_STEPS

# a ratio outside this says more about the run than about the machine's AdamW
PLAUSIBLE_RATIO = (0.5, 2.0)


def add_refine_command(sub, units: str) -> None:
    help = ("set a profile's CPU AdamW rate to the one a `layerslide train` run on this machine "
            "kept (from its --out folder), for simulate/tune/train --profile")
    p = sub.add_parser("refine", help=help, description=help, epilog=units)
    p.add_argument("--from-run", required=True, metavar="DIR",
                   help=f"the --out folder of a train run on this machine (its {CHECK_FILE}; "
                        f"{WARMUP_STEPS + 2} steps or more: the first {WARMUP_STEPS} warm up)")
    p.add_argument("--out", required=True, help="profile file to write (.toml)")
    p.add_argument("--profile", help="the profile to refine (default: the one the run was "
                                     "predicted on); its other figures stay")
    p.add_argument("--name", help="the profile's name (default: the file's stem)")
    p.add_argument("--force", action="store_true",
                   help=f"write it even where the run kept under {PLAUSIBLE_RATIO[0]} or over "
                        f"{PLAUSIBLE_RATIO[1]} x the predicted rate")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_refine)


def kept_rate(check: dict, source: str) -> tuple[float, float]:
    """(the AdamW rate the run's machine kept, in the profile's terms; the ratio of the run's
    rate alone to its predicted one): the profile's figure the run was predicted with, times
    that ratio, so that refining again, or another profile, does not compound it."""
    predicted = check.get("predicted_adamw_alone_params_per_s")
    measured = check.get("measured_adamw_alone_params_per_s")
    if not predicted or not measured:
        raise UsageError(f"{source} has no CPU AdamW rate of the run's decoder layers alone "
                         "(updated on the GPU, never without a copy beside them, or a run "
                         f"too short): train a plan whose layers the CPU updates, "
                         f"{WARMUP_STEPS + 2} steps or more")
    past_warmup = check.get("past_warmup")  # a check from before it was recorded: by number
    if not (past_warmup if past_warmup is not None else check.get("first_step", 0) > WARMUP_STEPS):
        raise UsageError(f"{source} measured its warm-up steps only (compilation, first "
                         f"touches): train {WARMUP_STEPS + 2} steps or more")
    ratio = measured / predicted
    baseline = check.get("profile_adamw_params_per_s")
    if baseline is None:  # a check from before it recorded the figure: the profile as it is now
        baseline = profile_of(check["profile"]).host.adamw_params_per_s
    return baseline * ratio, ratio


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
    if not isinstance(check, dict) or not check.get("profile"):
        raise UsageError(f"{source} is no prediction check of `layerslide train`: train again")
    rate, ratio = kept_rate(check, str(source))
    if not (PLAUSIBLE_RATIO[0] <= ratio <= PLAUSIBLE_RATIO[1] or args.force):
        raise UsageError(f"the run kept {ratio:.2f} x the AdamW rate {check['profile']} "
                         "predicted: a run on another machine than the profile's, or blocks too "
                         "small for the rate to hold for a real model; check --profile and the "
                         "run, or pass --force")
    if args.profile:
        profile = profile_of(args.profile)
    else:
        try:
            profile = profile_of(check["profile"])
        except ValueError as err:  # a file the run named from another folder, or moved since
            raise UsageError(f"{err}: the run was predicted on {check['profile']!r}; name that "
                             "profile with --profile") from err
    before = profile.host.adamw_params_per_s
    kept = (f"refined by layerslide refine from {source}: the run's decoder layers kept CPU "
            f"AdamW alone at {ratio:.3f} x the rate predicted on {check['profile']}")
    refined = profile.with_adamw_rate(rate, kept)
    save_profile(dataclasses.replace(refined, name=args.name or out.stem), out)
    print(f"host.adamw_throughput {before / 1e9:.2f} -> {rate / 1e9:.2f} Gparam/s ({ratio:.3f} x "
          f"{check['profile']}'s, as {args.from_run} ran it; host memory bandwidth and the compact "
          f"moments' rates with it); wrote {out}: use it with --profile {out}")
    return 0
