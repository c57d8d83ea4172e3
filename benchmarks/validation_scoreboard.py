"""Issue 26's scoreboard: every row measured on the H200 since the 7-14B rows came in, each
predicted again by this checkout's simulator on its own call's calibration, judged together by
regime against the issue's targets (validate_sim's report).

    python benchmarks/validation_scoreboard.py --out benchmarks/results/scoreboard_DATE

No GPU: the measurements stay as committed; only the predictions are made here. A row's label
is prefixed by its call (`12-03b/call1:8b-mb16-w2-host`), and its policy group too, so that rows
of different machines are not ranked against each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/...`

from benchmarks.validate_sim import CONFIGS, report, repredict

# issue 26's validation calls, from before the suites, are in the results' archive
RESULTS = Path(__file__).resolve().parent / "results" / "archive"
# the calls with a thorough calibration of their own (validation_2026-12-04b's calls 2-3 and
# lane_waits_2026-12-04 compare executor variants on call1's profile: not predictions)
CALLS = ("validation_2026-12-03a", "validation_2026-12-03b/call1",
         "validation_2026-12-03b/call2", "validation_2026-12-03b/call3",
         "validation_2026-12-03c/call1", "validation_2026-12-03c/call2",
         "validation_2026-12-03c/call3", "validation_2026-12-04/call1",
         "validation_2026-12-04/call2", "validation_2026-12-04/call3",
         "validation_2026-12-04b/call1", "validation_2026-12-04c/call1",
         "validation_2026-12-04c/call2", "validation_2026-12-04c/call3",
         "validation_2026-12-04c/call4")
PROFILE = "h200-calibrated.toml"
# rows whose executor path has changed since they were measured, so that they say nothing of
# this code, with where the row was measured again
SUPERSEDED = {("validation_2026-12-03a", "qwen4b-mb4x4-w2-host"):
              "ran before the native grad-sum kernel (accumulate_2026-12-03); again in 12-03b/call3"}
# rows whose reserved GPU memory the executor has changed since (their step time and allocated
# peak still count): under layer-major accumulation the embedding's dense grad stayed alive
# through the rounding of its sum, a third [V, h] block beside the head's allocated peak (fixed
# in session 26, benchmarks/results/archive/validation_2026-12-04)
EMBEDDING_GRAD_FIX = "held the embedding's grad through its sum's rounding; again in 12-04/call2"
GPU_RESERVE_SUPERSEDED = {
    ("validation_2026-12-03b/call1", "8b-mb4x4-w2-host-lm"): EMBEDDING_GRAD_FIX,
    ("validation_2026-12-03b/call2", "qwen8b-mb8x4-w2-host-lm"): EMBEDDING_GRAD_FIX,
    ("validation_2026-12-04/call1", "qwen8b-mb8x4-w2-host-lm"): EMBEDDING_GRAD_FIX}
# calls calibrated with LAYERSLIDE_CPU_NICE=19, before calibrate measured the launch price
# beside AdamW both ways: the one price their profile names plain is the one beside niced
# workers, and their rows run at nice 0 have no price of their own (left out)
NICED_CALIBRATIONS = {"validation_2026-12-04c/call3", "validation_2026-12-04c/call4"}


def niced_price_named(profile):
    """The profile with its launch price beside AdamW moved to the niced field, none plain."""
    host = dataclasses.replace(
        profile.host, kernel_launch_beside_kernels_s=None,
        kernel_launch_beside_niced_kernels_s=profile.host.kernel_launch_beside_kernels_s)
    return dataclasses.replace(profile, host=host)


def adjusted(scale: dict[str, float], fix: dict[str, float]):
    """A profile change for repredict, a what-if over the committed measurements: each
    `part.field` (e.g. gpu.kernel_launch_s) in `scale` times its factor, each in `fix` set to
    its value."""
    def adjust(profile):
        parts = {}
        for key, number in [*scale.items(), *fix.items()]:
            part, field = key.split(".", 1)
            spec = parts.get(part, getattr(profile, part))
            if key in scale and getattr(spec, field) is None:
                raise SystemExit(f"--scale {key}: {profile.name} has no {key} to scale; --set it")
            value = getattr(spec, field) * number if key in scale else number
            parts[part] = dataclasses.replace(spec, **{field: value})
        return dataclasses.replace(profile, **parts)
    return adjust


def profile_field_and_number(text: str) -> tuple[str, float]:
    """PART.FIELD=NUMBER, the field checked against the profile's numeric fields."""
    from layerslide.hwprofiles import load_profile

    key, _, number = text.partition("=")
    part, _, field = key.partition(".")
    spec = getattr(load_profile("h200-bench"), part, None)
    kinds = {f.name: str(f.type) for f in dataclasses.fields(spec)} \
        if dataclasses.is_dataclass(spec) else {}
    if not kinds.get(field, "").startswith("float"):  # float or float | None
        raise argparse.ArgumentTypeError(f"{key!r} is no real-valued profile field: name one "
                                         "as gpu.kernel_launch_s or host.adamw_params_per_s")
    try:
        value = float(number)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: the number after '=' must be finite, > 0")
    return key, value


def call_rows(call: str, results: Path = RESULTS, adjust=None) -> list[dict]:
    """A call's rows predicted again on its own profile (changed by `adjust` where given),
    labelled by the call."""
    folder = results / call
    missing = [p for p in (folder / "validation.json", folder / PROFILE) if not p.is_file()]
    if missing:
        raise SystemExit(f"{call}: {', '.join(map(str, missing))} not there: name calls whose "
                         f"folder holds validation.json and {PROFILE}")
    short = call.removeprefix("validation_2026-")
    niced_calibration = call in NICED_CALIBRATIONS
    if niced_calibration:  # a what-if changes the profile as measured, then the price is named
        given = adjust
        adjust = (lambda p: niced_price_named(given(p))) if given else niced_price_named
    rows = []
    for row in repredict([folder / "validation.json"], str(folder / PROFILE), adjust=adjust):
        label = row["label"]
        if (call, label) in SUPERSEDED:
            print(f"{call}: {label} left out: {SUPERSEDED[call, label]}", file=sys.stderr)
            continue
        if niced_calibration and not row["policy"]["executor"].get("cpu_nice"):
            print(f"{call}: {label} left out: run at nice 0, its calibration priced launches "
                  "beside niced workers only", file=sys.stderr)
            continue
        if (call, label) in GPU_RESERVE_SUPERSEDED:
            print(f"{call}: {label}'s reserved GPU memory left out: "
                  f"{GPU_RESERVE_SUPERSEDED[call, label]}", file=sys.stderr)
            row = {**row, "measured_gpu_reserved_bytes": None, "gpu_memory_detail": None}
        # variants are reported apart by their configuration's mark (rows may predate it)
        variant_of = CONFIGS.get(label, row["config"]).get("variant_of")
        rows.append({**row, "label": f"{short}:{label}", "call": call,
                     "config": {**row["config"], **({"variant_of": variant_of}
                                                     if variant_of else {})},
                     "group": f"{short}:{row['group']}" if row.get("group") else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the report")
    ap.add_argument("--calls", default=",".join(CALLS),
                    help="comma-separated folders under benchmarks/results/archive (default: "
                         "issue 26's calls since 2026-12-03)")
    ap.add_argument("--scale", type=profile_field_and_number, action="append", default=[],
                    metavar="PART.FIELD=FACTOR",
                    help="what-if: every call's profile with this field times the factor "
                         "(e.g. gpu.kernel_launch_s=2); repeatable")
    ap.add_argument("--set", type=profile_field_and_number, action="append", default=[],
                    metavar="PART.FIELD=VALUE", dest="fix",
                    help="what-if: every call's profile with this field at this value, in the "
                         "profile's units (e.g. gpu.kernel_launch_s=19e-6); repeatable")
    args = ap.parse_args()
    scale, fix = dict(args.scale), dict(args.fix)
    if set(scale) & set(fix):
        ap.error(f"{', '.join(sorted(set(scale) & set(fix)))}: --scale or --set, not both")
    adjust = adjusted(scale, fix) if scale or fix else None
    calls = [c for c in args.calls.split(",") if c]
    for call in calls:  # all checked before any prediction
        if not (RESULTS / call / PROFILE).is_file():
            ap.error(f"{RESULTS / call / PROFILE} is not there")
    rows, start = [], time.monotonic()
    for k, call in enumerate(calls, 1):
        found = call_rows(call, adjust=adjust)
        rows += found
        print(f"[{k}/{len(calls)}] {call}: {len(found)} rows predicted again "
              f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.json").write_text(json.dumps(rows, indent=1))
    report(rows, args.out)
    if adjust is not None:  # the report says it is a what-if, and which
        what_if = {"scale": scale, "set": fix}
        table = args.out / "validation.md"
        table.write_text(f"What-if, every call's profile changed: {json.dumps(what_if)}\n\n"
                         + table.read_text())
        summary = args.out / "validation_summary.json"
        summary.write_text(json.dumps({"what_if": what_if, **json.loads(summary.read_text())},
                                      indent=1))


if __name__ == "__main__":
    main()
