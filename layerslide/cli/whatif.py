"""`layerslide whatif`: one model across profiles (or rank counts), or models on one profile,
each tuned; with --target-tokens-per-s, the purchase question (cli/purchase.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial

import pandas as pd

from layerslide.cli.options import (
    UsageError,
    gib,
    model_of,
    profile_of,
    progress_printer,
    tolerance_of,
)
from layerslide.cli.printing import gib_columns, print_json, records
from layerslide.cli.purchase import purchase_question
from layerslide.cli.refusals import (
    check_gpu_cap,
    note_cards_under_cap,
)
from layerslide.hwprofiles import (
    builtin_one_gpu_profiles,
    builtin_several_gpu_profiles,
)
from layerslide.planner import PRESETS, resolve_model
from layerslide.planner.settings import MOMENT_PRECISIONS
from layerslide.reports import (
    format_table,
)
from layerslide.tuner import SearchSpace
from layerslide.tuner.processes import Interrupted
from layerslide.tuner.whatif import (
    WHATIF_SPACE,
    WhatIfRow,
    across_models,
    across_profiles,
    across_ranks,
    capacity_bounds,
    largest_fitting,
    rank_counts,
    speedups,
)


def _whatif_table(rows: list[WhatIfRow]) -> pd.DataFrame:
    table = pd.DataFrame([r.row() for r in rows])
    table["params_B"] = table.pop("params") / 1e9
    return table


def _largest_by_size(rows: list[WhatIfRow], profile, chosen: str) -> list[dict]:
    """The largest fitting model for each (RAM, NVMe) size tried, and the state-only bound."""
    combos = dict.fromkeys((r.ram_bytes, r.nvme_bytes) for r in rows)
    out = []
    for ram, nvme in combos:
        best = largest_fitting([r for r in rows if (r.ram_bytes, r.nvme_bytes) == (ram, nvme)])
        sized = profile.with_overrides(ram_bytes=ram, nvme_capacity_bytes=nvme)
        bounds = {precision: capacity_bounds(sized, precision)
                  for precision in MOMENT_PRECISIONS}
        out.append({"ram_bytes": ram, "nvme_bytes": nvme,
                    "largest_fitting_model": best.model if best else None,
                    "params": best.params if best else None, **capacity_bounds(sized, chosen),
                    "all_in_ram_params_by_moments": {
                        k: v["all_in_ram_params"] for k, v in bounds.items()}})
    return out


def _whatif_space(args) -> SearchSpace:
    return replace(WHATIF_SPACE, moment_precisions=(args.moment_precision,))


def cmd_whatif(args) -> int:
    if args.target_tokens_per_s is not None:
        return purchase_question(args)
    buying = {"--platforms": args.platforms, "--gpus": args.gpus, "--drives": args.drives,
              "--workers": args.workers, "--csv": args.csv, "--out": args.out}
    given = [flag for flag, value in buying.items() if value is not None]
    if given:
        raise UsageError(f"{', '.join(given)} go with --target-tokens-per-s T (what to buy)")
    if args.host_counts and not args.gpu_counts:
        raise UsageError("--host-counts goes with --gpu-counts N,...: give both, e.g. "
                         "--gpu-counts 8 --host-counts 1,2")
    search = {"space": _whatif_space(args), "exhaustive": args.exhaustive,
              "tolerance": tolerance_of(args), "seq_len": args.seq_len,
              "gpu_memory_bytes": args.gpu_memory,
              "progress": progress_printer("whatif: tuned")}
    profile, title, rows_of = (_whatif_models if args.profile_axis else
                               _whatif_ranks if args.gpu_counts else _whatif_profiles)(args)
    interrupted = False
    try:
        rows = rows_of(**search)
    except Interrupted as stop:  # Ctrl-C: the rows tuned so far
        rows, interrupted = [r for r in stop.results if r is not None], True
        print(f"interrupted (Ctrl-C): the {len(rows)} rows tuned so far", file=sys.stderr)
        if not rows:
            return 130
    _print_whatif(args, rows, title + (" (interrupted: the rows tuned so far)"
                                       if interrupted else ""), profile, interrupted)
    return 130 if interrupted else 0


def _whatif_models(args):
    """whatif --on-profile P: the profile, the title and the search of each model on it, for
    each RAM and NVMe size."""
    if args.model or args.profiles or args.gpu_counts:
        raise UsageError("--on-profile compares models: give them with --models, "
                         "not --model, --profiles or --gpu-counts")
    profile = profile_of(args.profile_axis, args.nvme_drives)
    check_gpu_cap(args.gpu_memory, profile)
    models = [resolve_model(n) for n in (args.models or tuple(PRESETS))]
    return profile, f"models on {profile.name}", partial(
        across_models, profile, models, ram_sizes=args.ram or (None,),
        nvme_sizes=args.nvme or (None,))


def _whatif_profiles(args):
    """whatif --model M: the title and the search of the model on each profile."""
    model = _model_across_profiles(args)
    profiles = [profile_of(n, args.nvme_drives) for n in args.profiles or
                [p.name for p in builtin_one_gpu_profiles()]]
    # a cap that lowers some cards across profiles; one above every card caps none
    check_gpu_cap(args.gpu_memory, max(profiles, key=lambda p: p.gpu.memory_bytes))
    note_cards_under_cap(args.gpu_memory, profiles)
    return None, f"{model.name} across profiles", partial(across_profiles, model, profiles)


def _model_across_profiles(args):
    """--model M of whatif across profiles, its flags checked."""
    if not args.model:
        raise UsageError("give --model M (across profiles) or --on-profile P (across models)")
    if args.models or args.ram or args.nvme:
        raise UsageError("--models, --ram and --nvme go with --on-profile (--ram also with "
                         "--target-tokens-per-s)")
    return model_of(args)


def _whatif_ranks(args):
    """whatif --model M --gpu-counts N,...: the title and the search of the model on each
    profile at each GPU and host count it holds (the others said and left out)."""
    model = _model_across_profiles(args)
    names = args.profiles or [p.name for p in builtin_several_gpu_profiles()]
    profiles = [profile_of(n, args.nvme_drives) for n in names]
    check_gpu_cap(args.gpu_memory, max(profiles, key=lambda p: p.gpu.memory_bytes))
    placements, skipped = rank_counts(profiles, args.gpu_counts, args.host_counts or (1,))
    for why in skipped:
        print(f"whatif: {why}", file=sys.stderr)
    if not placements:
        raise UsageError("no profile holds any of --gpu-counts "
                         f"{','.join(map(str, args.gpu_counts))}: give smaller counts or "
                         "profiles of more GPUs (`layerslide profiles` lists each one's)")
    return None, f"{model.name} on 1 to {max(args.gpu_counts)} GPUs", partial(
        across_ranks, model, placements)


def _print_whatif(args, rows: list[WhatIfRow], title: str, profile, interrupted: bool) -> None:
    table = _whatif_table(rows)
    if args.gpu_counts:
        table.insert(table.columns.get_loc("tokens_per_s") + 1, "speedup", speedups(rows))
    largest = (_largest_by_size(rows, profile, args.moment_precision)
               if args.profile_axis else [])
    if args.json:
        print_json({"rows": records(table), "largest": largest, "interrupted": interrupted})
        return
    print(f"what-if: {title}")
    cols = ["model", "params_B", "profile", *(["gpus", "hosts"] if args.gpu_counts else []),
            "ram_bytes", "nvme_bytes", "feasible", "tokens_per_s",
            *(["speedup", "bound"] if args.gpu_counts else ["bottleneck"]),
            "peak_gpu_bytes", "peak_host_bytes", "peak_nvme_bytes", "config", "reason"]
    print(format_table(gib_columns(table[[c for c in cols if c in table.columns]])))
    for entry in largest:
        name = entry["largest_fitting_model"]
        print(f"largest model that fits with {gib(entry['ram_bytes']):.0f} GiB RAM and "
              f"{gib(entry['nvme_bytes']):.0f} GiB NVMe: "
              + (f"{name} ({entry['params'] / 1e9:.1f}B params)" if name else "none")
              + f"; state-only bound ({args.moment_precision} moments) "
                f"{entry['all_in_ram_params'] / 1e9:.1f}B params in RAM, "
                f"{entry['ram_and_nvme_params'] / 1e9:.1f}B with NVMe")
        print("  all in RAM by moment precision: " + ", ".join(
            f"{k} {v / 1e9:.1f}B" for k, v in entry["all_in_ram_params_by_moments"].items()))
