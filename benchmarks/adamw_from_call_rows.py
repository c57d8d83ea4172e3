"""What-if over the scoreboard's rows: each row predicted with the CPU AdamW at the rate the
other rows of its call kept in training, instead of calibrate's figure. This is a
prediction: the row's own measurement is not read, nor are the rows of its configuration run
another way (its variants).

It asks whether a short training run on the lent machine, rather than calibrate's AdamW
test, should set the rate a prediction uses: calibrate's test and the rows' in-training rate
differ by 0-19% from one lease to the next (issue 26's CPU-bound misses).

    python benchmarks/adamw_from_call_rows.py benchmarks/results/scoreboard_DATE [--out FILE]

Reads SCOREBOARD/validation.json (validation_scoreboard.py's); about a second a row on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json

from benchmarks import validation_scoreboard as scoreboard
from benchmarks.validate_sim import at_adamw_rate, predict, row_settings
from layerslide.reports.validation import row_target


def base_of(row: dict) -> str:
    """The configuration a row runs, its variants included (the label without its call)."""
    return row["config"].get("variant_of") or row["label"].split(":", 1)[1]


def other_configurations(rows: list[dict], row: dict) -> list[dict]:
    """The rows of the row's call that run another configuration with fp32 moments (a compact
    row's AdamW figure is its kernel's, scaled)."""
    return [r for r in rows if r["call"] == row["call"] and base_of(r) != base_of(row)
            and r["policy"]["residency"].get("moment_precision", "fp32") == "fp32"]


def rate_sources(rows: list[dict], row: dict) -> list[float]:
    """The in-training AdamW rates of the other configurations of the row's call."""
    return [r["adamw_in_situ_params_per_s"] for r in other_configurations(rows, row)
            if r.get("adamw_in_situ_params_per_s")]


def alone_ratios(rows: list[dict], row: dict) -> list[float]:
    """What `layerslide refine` reads of a run, for the other configurations of the row's call:
    their decoder layers' AdamW with no copy beside it, measured over predicted."""
    found = []
    for r in other_configurations(rows, row):
        measured = (r.get("measured_adamw_by_company") or {}).get("alone")
        predicted = (r.get("predicted_adamw_by_company") or {}).get("alone")
        if measured and predicted:
            found.append(measured["params_per_s"] / predicted["params_per_s"])
    return found


def call_profile(call: str):
    from layerslide.hwprofiles import load_profile

    profile = load_profile(str(scoreboard.RESULTS / call / scoreboard.PROFILE))
    return (scoreboard.niced_price_named(profile) if call in scoreboard.NICED_CALIBRATIONS
            else profile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scoreboard", type=Path, help="a folder validation_scoreboard.py wrote")
    ap.add_argument("--out", type=Path, help="also write the rows and summary here (JSON)")
    args = ap.parse_args()
    source = args.scoreboard / "validation.json"
    if not source.is_file():
        raise SystemExit(f"{source} is not there: name a folder validation_scoreboard.py wrote")
    rows = json.loads(source.read_text())
    profiles: dict[str, object] = {}
    results = []
    for row in rows:
        if row["config"].get("variant_of"):
            continue
        sources = rate_sources(rows, row)
        if not sources:
            print(f"{row['label']}: no other configuration of its call kept an AdamW rate",
                  file=sys.stderr)
            continue
        if row["call"] not in profiles:
            profiles[row["call"]] = call_profile(row["call"])
        profile = profiles[row["call"]]
        rate = statistics.median(sources)
        spec, train, policy = row_settings(row)
        found = predict(spec, train, policy, at_adamw_rate(profile, rate),
                        row.get("gpu_memory_bytes", 24 * 2**30))
        measured = row["measured_step_s"]
        ratios = alone_ratios(rows, row)
        refine_error = None
        if ratios:  # refine's read: the calibrated figure times the others' median ratio
            by_refine = predict(spec, train, policy,
                                at_adamw_rate(profile, profile.host.adamw_params_per_s
                                              * statistics.median(ratios)),
                                row.get("gpu_memory_bytes", 24 * 2**30))
            refine_error = by_refine["predicted_step_s"] / measured - 1
        results.append({
            "label": row["label"], "regime": row["predicted_regime"],
            "target": row_target(row), "measured_step_s": measured,
            "calibrated_rate": profile.host.adamw_params_per_s, "other_rows_rate": rate,
            "error_calibrated": row["predicted_step_s"] / measured - 1,
            "error_other_rows": found["predicted_step_s"] / measured - 1,
            "error_refine_read": refine_error,
            "regime_other_rows": found["predicted_regime"]})
        print(f"{row['label']}: {results[-1]['error_calibrated']:+.1%} -> "
              f"{results[-1]['error_other_rows']:+.1%}", file=sys.stderr, flush=True)
    header = ("| row | regime | calibrate's AdamW Gparam/s | the other rows' | error, calibrated "
              "| at the other rows' rate | at their ratio alone (refine's read) | target |")
    lines = [header, "|---" * 8 + "|"]
    for r in results:
        target = "mean 3%" if r["target"] is None else f"{r['target']:.1%}"
        refine = "-" if r["error_refine_read"] is None else f"{r['error_refine_read']:+.1%}"
        lines.append(f"| {r['label']} | {r['regime']} | {r['calibrated_rate'] / 1e9:.2f} | "
                     f"{r['other_rows_rate'] / 1e9:.2f} | {r['error_calibrated']:+.1%} | "
                     f"{r['error_other_rows']:+.1%} | {refine} | {target} |")
    summary = {}
    for regime in sorted({r["regime"] for r in results}):
        group = [r for r in results if r["regime"] == regime]
        entry = {"rows": len(group)}
        for key in ("error_calibrated", "error_other_rows"):
            entry[f"{key}_mean_abs"] = statistics.fmean(abs(r[key]) for r in group)
            if regime != "GPU":
                entry[f"{key}_within"] = sum(abs(r[key]) <= r["target"] for r in group)
        read = [r for r in group if r["error_refine_read"] is not None]
        if read:  # the rows refine's read covers, each way
            entry["refine_read_rows"] = len(read)
            for key in ("error_calibrated", "error_other_rows", "error_refine_read"):
                entry[f"{key}_mean_abs_where_refine_reads"] = statistics.fmean(
                    abs(r[key]) for r in read)
            if regime != "GPU":
                for key in ("error_calibrated", "error_other_rows", "error_refine_read"):
                    entry[f"{key}_within_where_refine_reads"] = sum(
                        abs(r[key]) <= r["target"] for r in read)
        summary[regime] = entry
        within = (f"; within target {entry['error_calibrated_within']} -> "
                  f"{entry['error_other_rows_within']} of {len(group)}" if regime != "GPU" else "")
        lines.append(f"\n- {regime}-bound rows ({len(group)}): mean absolute error "
                     f"{entry['error_calibrated_mean_abs']:.1%} -> "
                     f"{entry['error_other_rows_mean_abs']:.1%}{within}")
        if read:
            also = (f"; within target {entry['error_calibrated_within_where_refine_reads']}, "
                    f"{entry['error_other_rows_within_where_refine_reads']} and "
                    f"{entry['error_refine_read_within_where_refine_reads']}"
                    if regime != "GPU" else "")
            lines.append(f"  - the {len(read)} whose call's other rows had a rate alone: "
                         f"calibrated {entry['error_calibrated_mean_abs_where_refine_reads']:.1%}, "
                         f"the other rows' rate "
                         f"{entry['error_other_rows_mean_abs_where_refine_reads']:.1%}, their "
                         f"ratio alone (refine's read) "
                         f"{entry['error_refine_read_mean_abs_where_refine_reads']:.1%}{also}")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"rows": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
