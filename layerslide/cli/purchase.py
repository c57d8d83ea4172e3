"""`layerslide whatif --target-tokens-per-s`: the cheapest hardware variants that reach a
target, each variant tuned (tuner/purchase.py); a table, JSON, a CSV and a figure."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from layerslide.cli.options import (
    UsageError,
    model_of,
    progress_printer,
    tolerance_of,
)
from layerslide.cli.printing import print_json, records
from layerslide.outputs import writable_file, writable_folder
from layerslide.planner import Policy
from layerslide.reports import (
    format_table,
    plot_purchase,
)
from layerslide.tuner.processes import Interrupted
from layerslide.tuner.purchase import (
    DEFAULT_CARDS,
    DEFAULT_DRIVE_COUNTS,
    DEFAULT_PLATFORMS,
    DEFAULT_RAM_SIZES,
    PURCHASE_SPACE,
    purchase_search,
)
from layerslide.tuner.purchase import rank as purchase_rank
from layerslide.tuner.purchase import summary as purchase_summary
from layerslide.tuner.purchase import variants as purchase_variants


def purchase_question(args) -> int:
    """whatif --target-tokens-per-s T --model M: every variant in the ranges, cheapest first."""
    target, tolerance = args.target_tokens_per_s, tolerance_of(args)
    _check_purchase_flags(args)
    model = model_of(args)
    candidates, skipped = purchase_variants(
        args.platforms or DEFAULT_PLATFORMS, args.gpus or DEFAULT_CARDS,
        args.ram or DEFAULT_RAM_SIZES, args.drives or DEFAULT_DRIVE_COUNTS)
    if not candidates:
        raise UsageError("no variant to try: every combination was refused by its platform ("
                         + "; ".join(f"{s}: {why}" for s, why in skipped[:3]) + ")")
    space = replace(PURCHASE_SPACE, moment_precisions=(args.moment_precision,))
    if not args.json:
        tried = len(list(space.candidates(args.seq_len, None, Policy.of())))
        print(f"what to buy: {model.name} at {target:g} tokens/s or more, {len(candidates)} "
              f"variants, each tuned over {tried} candidates", flush=True)
    interrupted = False
    try:
        rows = purchase_search(model, target, candidates, seq_len=args.seq_len, space=space,
                               workers=args.workers, exhaustive=args.exhaustive,
                               tolerance=tolerance,
                               progress=progress_printer("whatif: variants tuned", quiet_s=0))
    except Interrupted as stop:  # Ctrl-C: the variants tuned so far
        done = [r for r in stop.results if r is not None]
        print(f"interrupted (Ctrl-C): the {len(done)} of {len(candidates)} variants tuned so "
              "far", file=sys.stderr)
        if not done:
            return 130
        rows, interrupted = purchase_rank(done, target), True
    lines = purchase_summary(rows, target)
    if interrupted:
        lines.insert(0, f"(interrupted: {len(rows)} of {len(candidates)} variants tuned)")
    _write_purchase(args, model, rows, lines, skipped)
    return 130 if interrupted else 0


def _check_purchase_flags(args) -> None:
    """The purchase question's flags, refused before any work."""
    target = args.target_tokens_per_s
    if not (target > 0 and target != float("inf")):
        raise UsageError(f"--target-tokens-per-s {target:g}: give a throughput more than 0")
    if not args.model:
        raise UsageError("--target-tokens-per-s needs --model M: the model to buy for")
    clashes = {"--profiles": args.profiles, "--on-profile": args.profile_axis,
               "--models": args.models, "--nvme": args.nvme, "--gpu-memory": args.gpu_memory,
               "--nvme-drives": args.nvme_drives}
    given = [flag for flag, value in clashes.items() if value is not None]
    if given:
        raise UsageError(f"{', '.join(given)} do not go with --target-tokens-per-s: the "
                         "variants come from --platforms, --gpus, --ram and --drives")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give 1 or more")
    writable_file("--csv", args.csv)
    if args.out:
        writable_folder("--out", args.out)


def _write_purchase(args, model, rows: list[dict], lines: list[str], skipped) -> None:
    """The purchase table and summary: printed (or as JSON), and to --csv and --out."""
    target = args.target_tokens_per_s
    table = pd.DataFrame(rows)
    data = {"model": model.name, "target_tokens_per_s": target, "seq_len": args.seq_len,
            "moment_precision": args.moment_precision, "rows": records(table),
            "skipped": [{"profile": s, "why": why} for s, why in skipped], "summary": lines}
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "purchase.csv", index=False)
        (out / "purchase.json").write_text(json.dumps(data, indent=2, default=str,
                                                      allow_nan=False) + "\n")
        plot_purchase(table, out / "purchase.png", target=target,
                      title=f"{model.name}: simulated tokens/s against machine cost")
    text = _purchase_text(table, lines, skipped, target)
    if args.out:
        (Path(args.out) / "summary.txt").write_text(text + "\n")
    if args.json:
        print_json(data)
    else:
        print(text)


def _purchase_text(table: pd.DataFrame, lines: list[str], skipped, target: float) -> str:
    view = pd.DataFrame({
        "profile": table["profile"],
        "cost": table["cost"],
        "tokens_per_s": table["tokens_per_s"],
        "meets": table["meets_target"],
        "tok/s_per_1k": table["tokens_per_s_per_1k_cost"],
        "bound": [f"{b} ({s:.0%})" if isinstance(b, str) else "" for b, s in
                  zip(table["bound"], table["bound_share_of_step"])],
        "next_cheaper_short": [f"{v:.0%}" if pd.notna(v) else "" for v in
                               table["next_cheaper_short_of_target"]],
        "config": table["config"],
        "reason": table["reason"],
    })
    currency = next((c for c in table["currency"] if isinstance(c, str)), "")
    legend = (f"cost: the profiles' prices in {currency or '(none)'} (price_basis in "
              "--csv/--json says which are list prices and which the user's figures); bound: "
              "the resource whose per-step floor is the largest, as a share of the step; "
              f"next_cheaper_short: how far the next cheaper variant falls short of {target:g} "
              "tokens/s")
    out = [format_table(view), "", legend, *lines]
    if skipped:
        out.append(f"not offered ({len(skipped)}): " + "; ".join(
            f"{s} ({why})" for s, why in skipped[:6]) + (" ..." if len(skipped) > 6 else ""))
    return "\n".join(out)
