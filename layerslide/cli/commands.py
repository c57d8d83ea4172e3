"""The subcommands: each takes parsed arguments, prints a table (or JSON) and returns an exit code."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd

from layerslide.cli.options import (
    DEFAULT_PROFILE,
    UsageError,
    gib,
    model_of,
    policy_of,
    profile_of,
    progress_printer,
    train_of,
    with_env_overrides,
)
from layerslide.cli.refusals import (
    FIT_HINTS,
    check_gpu_cap,
    note_cards_under_cap,
    refuse_flags_a_plan_replaces,
    refuse_policy_flags_that_would_not_act,
)
from layerslide.cli.tune_data import data_capped
from layerslide.hwprofiles import (
    builtin_one_gpu_profiles,
    builtin_profiles,
    builtin_several_gpu_profiles,
)
from layerslide.outputs import writable_file, writable_folder
from layerslide.planner import PRESETS, Plan, Policy, TrainSpec, build_plan, resolve_model
from layerslide.planner.settings import MOMENT_PRECISIONS
from layerslide.reports import (
    format_table,
    plot_memory,
    plot_purchase,
    plot_timeline,
    write_chrome_trace,
)
from layerslide.simulator import Prediction, simulate
from layerslide.simulator.ranks import check_ranks
from layerslide.trace import TIERS
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.lanes_first import chosen_in_environment, niced_where_gpu_bound
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
from layerslide.tuner.whatif import (
    STATE_BYTES_PER_PARAM,
    WHATIF_SPACE,
    Interrupted,
    WhatIfRow,
    across_models,
    across_profiles,
    across_ranks,
    capacity_bounds,
    largest_fitting,
    rank_counts,
    speedups,
)


def _print_json(data) -> None:
    # allow_nan=False: NaN is not JSON; missing values must already be None
    print(json.dumps(data, indent=2, default=str, allow_nan=False))


def _records(df: pd.DataFrame) -> list[dict]:
    """DataFrame rows as dicts with None (JSON null) where pandas holds NaN."""
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def _gib_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Rename *_bytes columns to *_GiB with values in GiB, for people."""
    out = df.copy()
    for col in [c for c in df.columns if c.endswith("_bytes")]:
        out[col.removesuffix("_bytes") + "_GiB"] = gib(out.pop(col))
    return out


def cmd_profiles(args) -> int:
    profiles = builtin_profiles()
    if args.json:
        _print_json([p.to_dict() for p in profiles])
        return 0
    rows = [{
        "profile": p.name, "gpu": p.gpu.name, "gpu_GiB": gib(p.gpu.memory_bytes),
        "bf16_TFLOP/s": p.gpu.bf16_flops_per_s / 1e12, "h2d_GB/s": p.link.h2d_bytes_per_s / 1e9,
        "ram_GiB": gib(p.host.ram_bytes), "adamw_Gparam/s": p.host.adamw_params_per_s / 1e9,
        "host_mem_GB/s": p.host.memory_bytes_per_s / 1e9,
        "nvme_drives": p.storage.drives, "nvme_read_GB/s": p.storage.read_bytes_per_s / 1e9,
        "nvme_GiB": gib(p.storage.total_capacity_bytes),
    } for p in profiles]
    print(format_table(pd.DataFrame(rows)))
    print("\nGB = 1e9 bytes, GiB = 2^30 bytes. Add your own: --profile path/to/profile.toml")
    return 0


def cmd_models(args) -> int:
    models = list(PRESETS.values())
    if args.json:
        _print_json([{**m.to_dict(), "total_params": m.total_params} for m in models])
        return 0
    rows = [{
        "model": m.name, "params_B": m.total_params / 1e9, "layers": m.num_layers,
        "hidden": m.hidden_size, "ffn": m.intermediate_size, "heads": m.num_attention_heads,
        "kv_heads": m.num_key_value_heads, "vocab": m.vocab_size, "tied": m.tie_word_embeddings,
        "state_GiB_all_in_RAM": gib(STATE_BYTES_PER_PARAM * m.total_params),
    } for m in models]
    print(format_table(pd.DataFrame(rows)))
    print("\nparams_B in 1e9. state_GiB_all_in_RAM: fp32 master + AdamW m, v + bf16 copy "
          "(14 B/param). Or pass --model path/to/config.json")
    return 0


def _plan_summary(plan: Plan) -> dict:
    per_lane = {lane: len(order) for lane, order in plan.lane_order.items() if order}
    kinds = Counter(t.kind for t in plan.tasks)
    step_bytes = Counter()
    for t in plan.tasks:
        if t.step == 0 and t.lane in ("h2d", "d2h", "nvme_read", "nvme_write"):
            step_bytes[t.lane] += t.bytes
    return {
        "model": plan.model.name, "params": plan.model.total_params,
        "train": plan.train.to_dict(), "policy": plan.policy.to_dict(),
        "num_steps": plan.num_steps, "tasks": plan.graph.number_of_nodes(),
        "edges": plan.graph.number_of_edges(), "tasks_per_lane": per_lane,
        "tasks_per_kind": dict(kinds),
        "bytes_per_step": dict(step_bytes),
        "static_bytes": {t: plan.static_bytes(t) for t in TIERS},
    }


def _build(args) -> Plan:
    train, policy = train_of(args), policy_of(args)
    refuse_policy_flags_that_would_not_act(args, train, policy)
    return build_plan(model_of(args), train, policy, num_steps=args.steps)


def _save(plan: Plan, path: str) -> None:
    plan.save(path)


def cmd_plan(args) -> int:
    writable_file("-o", args.output)
    plan = _build(args)
    if args.output:
        _save(plan, args.output)
    summary = _plan_summary(plan)
    if args.json:
        _print_json(summary)
        return 0
    print(f"plan: {plan.model.name}, {summary['tasks']} tasks, {summary['edges']} edges over "
          f"{plan.num_steps} steps")
    lanes = pd.DataFrame([{"lane": k, "tasks": v,
                           "GB_per_step": summary["bytes_per_step"].get(k, 0) / 1e9}
                          for k, v in summary["tasks_per_lane"].items()])
    print(format_table(lanes))
    static = summary["static_bytes"]
    print("static memory (GiB): " + ", ".join(f"{t} {gib(static[t]):.2f}" for t in TIERS))
    if args.output:
        print(f"plan written to {args.output}")
    return 0


def _print_prediction(pred: Prediction) -> None:
    if pred.ranks > 1:
        print(f"{pred.ranks} ranks ({pred.ranks_per_host} GPUs per host x {pred.hosts} "
              f"hosts): one rank simulated on its share of the host; tokens/s and model "
              f"TFLOP/s are every rank's, MFU each GPU's, lanes and floors one rank's")
    if pred.step_s is not None:
        print(f"step {pred.step_s:.3f} s | {pred.tokens_per_s:,.0f} tokens/s | "
              f"{pred.model_flops_per_s / 1e12:.1f} model TFLOP/s | MFU {pred.mfu:.1%} | "
              f"bottleneck: {pred.bottleneck}")
        busy = ", ".join(f"{lane} {frac:.0%}" for lane, frac in pred.lane_busy.items())
        print(f"lane busy over the last step: {busy}")
        floors = sorted(pred.floors_s.items(), key=lambda kv: -kv[1])[:3]
        print(f"floor {pred.floor_s:.3f} s ({pred.floor_s / pred.step_s:.0%} of the step); "
              "largest bounds: " + ", ".join(f"{k} {v:.3f} s" for k, v in floors))
        print(f"bound: {pred.bound} ({pred.bound_share:.0%} of the step)")
        if pred.gpu_speedup != 1.0:
            print(f"GPU computing at {pred.gpu_speedup:.2f}x its efficiency tables' rate: a "
                  "power-capped GPU clocks higher the more it idles (profile gpu.busy_speedup)")
    print("peak memory (GiB): " + ", ".join(
        f"{t} {gib(pred.peak_bytes.get(t, 0)):.2f} / {gib(pred.limits_bytes[t]):.1f}"
        for t in TIERS))
    if pred.ranks_per_host > 1:
        per_host = pred.peak_bytes_per_host
        print(f"per host ({pred.ranks_per_host} ranks; GPU: each of its GPUs above): " + ", ".join(
            f"{t} {gib(per_host.get(t, 0)):.2f} / {gib(pred.limits_bytes[t]):.1f}"
            for t in ("host", "nvme")))
    if pred.simulated:
        print(f"GPU: {gib(pred.gpu_need_bytes):.2f} GiB must fit (runtime plus the caching "
              f"allocator's reserve of {gib(pred.gpu_reserved_bytes):.2f} GiB; "
              f"{gib(pred.gpu_allocated_peak_bytes):.2f} GiB allocated at the peak)")
    if not pred.feasible:
        print(f"INFEASIBLE: {pred.reason}")
        for overflow in pred.overflows:
            print(f"  to fit {overflow.tier}: {FIT_HINTS[overflow.tier]}")


def cmd_simulate(args) -> int:
    writable_file("--trace-out", args.trace_out)
    writable_folder("--report-dir", args.report_dir)
    tuned = {}
    if args.plan:
        if args.model:  # the plan holds its model: a second one would be ignored
            raise UsageError(f"--plan {args.plan} holds its model: drop --model {args.model} "
                             "(or drop --plan to build a plan for that model)")
        plan = Plan.load(args.plan)
        refuse_flags_a_plan_replaces(args, args.parser, plan, also={"steps": plan.num_steps})
        plan = replace(plan, policy=with_env_overrides(plan.policy))  # as `train` would run it
        tuned = plan.meta
    else:
        if not args.model:
            raise UsageError("give --model (and settings) or --plan FILE")
        plan = _build(args)
    # the drives a plan was tuned for go with the profile it was tuned for
    same_profile = args.profile in (None, tuned.get("tuned_for_profile"))
    drives = args.nvme_drives if args.nvme_drives is not None else (
        tuned.get("tuned_for_nvme_drives") if same_profile else None)
    profile = profile_of(args.profile or tuned.get("tuned_for_profile") or DEFAULT_PROFILE,
                         drives)
    if args.gpu_memory is None:
        args.gpu_memory = tuned.get("gpu_memory_bytes")
    else:
        check_gpu_cap(args.gpu_memory, profile)
    pred = simulate(plan, profile, gpu_memory_bytes=args.gpu_memory, label=plan.model.name)
    found = None if args.plan or chosen_in_environment() else niced_where_gpu_bound(
        plan.policy, pred, profile, lambda policy: simulate(  # as `train` runs it on a GPU
            replace(plan, policy=policy), profile, gpu_memory_bytes=args.gpu_memory,
            label=plan.model.name))
    if found is not None:
        plan, pred = replace(plan, policy=found[0]), found[1]
    if args.trace_out and pred.trace is not None:
        write_chrome_trace(pred.trace, args.trace_out)
    wrote_report = bool(args.report_dir and pred.trace is not None)
    if wrote_report:
        out = Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        plot_timeline(pred.trace, out / "timeline.png", title=f"{plan.model.name} on {profile.name}")
        plot_memory(pred.trace, out / "memory.png", limits_bytes=pred.limits_bytes)
        write_chrome_trace(pred.trace, out / "trace.json")
        pred.trace.save(out / "trace.layerslide.json")
    no_trace = (f"no trace written to {args.trace_out}: the plan was rejected before "
                f"simulating ({pred.reason})" if args.trace_out and pred.trace is None else None)
    if args.json:
        if no_trace:
            print(no_trace, file=sys.stderr)
        _print_json(pred.summary())
        return 0 if pred.feasible else 1
    print(f"{plan.model.name} on {profile.name}"
          + (f" (GPU capped at {gib(args.gpu_memory):.1f} GiB)"
             if args.gpu_memory is not None else ""))
    if found is not None:
        print(f"GPU-bound: predicted as `train` runs it on a GPU, the CPU optimizer's workers at "
              f"nice {plan.policy.executor.cpu_nice} (LAYERSLIDE_CPU_NICE=0 keeps them at 0)")
    _print_prediction(pred)
    if wrote_report:
        print(f"report written to {args.report_dir}")
    elif args.report_dir:
        print(f"no report written: the plan was rejected before simulating ({pred.reason})")
    if no_trace:
        print(no_trace)
    return 0 if pred.feasible else 1


def _rejection_lines(result) -> list[str]:
    lines = []
    for tier, count in sorted(result.rejections().items()):
        worst = [c for c in result.candidates
                 if any(o.tier == tier for o in c.prediction.overflows)]
        example = worst[0].row()
        lines.append(f"  {count} over {tier} memory, e.g. micro_batch={example['micro_batch']} "
                     f"window={example['window']} activations={example['activations']}: "
                     f"{worst[0].prediction.reason}")
    return lines


def space_of(args) -> SearchSpace:
    defaults = SearchSpace()
    return SearchSpace(
        windows=args.windows or defaults.windows,
        micro_batches=args.micro_batches or defaults.micro_batches,
        grad_accums=args.grad_accums or defaults.grad_accums,
        accumulations=args.accumulations or defaults.accumulations,
        # schedules named on the command line are each tried at every accumulation
        step_major_max_accum=(max(args.grad_accums or defaults.grad_accums)
                              if args.accumulations else defaults.step_major_max_accum),
        max_tokens_per_step=(defaults.max_tokens_per_step if args.max_tokens_per_step is None
                             else args.max_tokens_per_step or None),
        activations=args.activations_list or defaults.activations,
        casts=args.casts or defaults.casts,
        optimizer_orders=args.optimizer_orders or defaults.optimizer_orders,
        moment_precisions=args.moment_precisions or defaults.moment_precisions,
        allow_nvme=not args.no_nvme, fill_gpu_updates=not args.no_gpu_updates,
        lanes_first=not chosen_in_environment())  # else the niceness set stays


def _by_accumulation(result) -> list[str]:
    """The fastest fitting candidate of each (accumulation, schedule), with what bounds it."""
    best: dict[tuple[int, str], object] = {}
    for c in result.feasible:  # best first
        key = (c.train.grad_accum, c.policy.schedule.accumulation)
        best.setdefault(key, c)
    return [f"x{ga}{'' if ga == 1 else ' ' + acc.replace('_major', '-major')} "
            f"{c.prediction.tokens_per_s:,.0f} tokens/s ({c.prediction.bottleneck}-bound)"
            for (ga, acc), c in sorted(best.items())]


def tolerance_of(args) -> float:
    """--tolerance PCT as a fraction, refused outside [0, 100)."""
    if not 0.0 <= args.tolerance < 100.0:
        raise UsageError(f"--tolerance {args.tolerance:g}: give a percentage from 0 to below 100")
    return args.tolerance / 100


def cmd_tune(args) -> int:
    model, profile = model_of(args), profile_of(args.profile, args.nvme_drives)
    tolerance = tolerance_of(args)
    check_gpu_cap(args.gpu_memory, profile)
    writable_file("-o", args.output)
    ranks = {"gpus": args.gpus, "hosts": args.hosts}
    TrainSpec(seq_len=args.seq_len, max_grad_norm=args.max_grad_norm, **ranks)  # before the sweep
    try:
        check_ranks(profile, **ranks)
    except ValueError as err:
        raise UsageError(str(err).replace("plan with", "tune with")) from None
    if args.tokenizer and not args.data:
        raise UsageError("--tokenizer counts --data's tokens: give --data FILE too")
    space = data_capped(space_of(args), args, model) if args.data else space_of(args)
    result = tune(model, profile, seq_len=args.seq_len, max_grad_norm=args.max_grad_norm,
                  space=space, gpu_memory_bytes=args.gpu_memory,
                  base_policy=with_env_overrides(Policy.of()), exhaustive=args.exhaustive,
                  tolerance=tolerance, progress=progress_printer("tune: candidates"), **ranks)
    if result.interrupted:
        print(f"interrupted (Ctrl-C): the best of the {len(result.candidates)} candidates "
              "simulated so far", file=sys.stderr)
    if args.output and result.best_plan is not None:
        _save(result.best_plan, args.output)
    table = pd.DataFrame([c.row() for c in result.candidates])
    if args.json:
        rows = _records(table)
        _print_json({"best": rows[0] if result.best else None, "candidates": rows,
                     "pruned": result.pruned, "not_simulated": result.bounded,
                     "interrupted": result.interrupted,
                     "plan_file": args.output if result.best_plan is not None else None})
        return 130 if result.interrupted else 0 if result.best else 1
    _print_tune_table(args, model, profile, result, table)
    lines = _rejection_lines(result)
    if lines:
        print("rejected:")
        print("\n".join(lines))
    if result.best_plan is None:
        print("nothing fits: see the rejections above")
        return 1
    if args.output:
        print(f"best plan written to {args.output} (for `layerslide simulate --plan` and train)")
    return 130 if result.interrupted else 0


def _print_tune_table(args, model, profile, result, table: pd.DataFrame) -> None:
    """tune's headline, its best candidates and the best of each accumulation."""
    pruned = (f", {result.pruned} more not tried (a smaller micro-batch of the same settings "
              "overflowed the GPU)") if result.pruned else ""
    if result.bounded:
        pruned += (f", {result.bounded} not simulated (their bound could not beat the best; "
                   "--exhaustive simulates them all)")
    on = (f"{args.gpus} GPUs x {args.hosts} hosts of {profile.name} (one rank tuned on its "
          "share of the host; tokens/s are every rank's, memory one rank's)"
          if args.gpus * args.hosts > 1 else profile.name)
    print(f"tune {model.name} on {on}: {len(result.candidates)} candidates{pruned}, "
          f"{len(result.feasible)} fit"
          + (f" (GPU capped at {gib(args.gpu_memory):.1f} GiB)" if args.gpu_memory else ""))
    shown = ["micro_batch", "grad_accum", *(["tokens_per_step"] if args.gpus * args.hosts > 1
                                            else []),
             "accumulation", "window", "activations", "cast",
             "gpu_updated_blocks",
             "gpu_updated_order", "moments_on_nvme", "master_on_nvme", "weights_on_nvme",
             "step_s", "floor_s", "tokens_per_s", "mfu", "bottleneck", "gpu_need_bytes",
             "peak_host_bytes"]
    if len(set(table["moment_precision"])) > 1:  # asked for: which one each row has
        shown.insert(shown.index("step_s"), "moment_precision")
    if len(set(table["cpu_nice"])) > 1:  # the GPU-bound leaders niced (tuner.lanes_first)
        shown.insert(shown.index("step_s"), "cpu_nice")
    if result.feasible:
        print(format_table(_gib_columns(table[table.feasible].head(args.top)[shown])))
        print("best by accumulation" + (" (of those simulated)" if result.bounded else "")
              + ": " + "; ".join(_by_accumulation(result)))


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
        return _whatif_purchase(args)
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
        _print_json({"rows": _records(table), "largest": largest, "interrupted": interrupted})
        return
    print(f"what-if: {title}")
    cols = ["model", "params_B", "profile", *(["gpus", "hosts"] if args.gpu_counts else []),
            "ram_bytes", "nvme_bytes", "feasible", "tokens_per_s",
            *(["speedup", "bound"] if args.gpu_counts else ["bottleneck"]),
            "peak_gpu_bytes", "peak_host_bytes", "peak_nvme_bytes", "config", "reason"]
    print(format_table(_gib_columns(table[[c for c in cols if c in table.columns]])))
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


def _whatif_purchase(args) -> int:
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
            "moment_precision": args.moment_precision, "rows": _records(table),
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
        _print_json(data)
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
