"""The planning subcommands without a search: profiles, models, plan and simulate. Each takes
parsed arguments, prints a table (or JSON) and returns an exit code."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd

from layerslide.cli.options import (
    DEFAULT_PROFILE,
    UsageError,
    gib,
    model_of,
    policy_of,
    profile_of,
    train_of,
    with_env_overrides,
)
from layerslide.cli.printing import print_json
from layerslide.cli.refusals import (
    FIT_HINTS,
    check_gpu_cap,
    refuse_flags_a_plan_replaces,
    refuse_policy_flags_that_would_not_act,
)
from layerslide.hwprofiles import (
    builtin_profiles,
)
from layerslide.outputs import writable_file, writable_folder
from layerslide.planner import PRESETS, Plan, build_plan
from layerslide.reports import (
    format_table,
    plot_memory,
    plot_timeline,
    write_chrome_trace,
)
from layerslide.simulator import Prediction, simulate
from layerslide.trace import TIERS
from layerslide.tuner.lanes_first import chosen_in_environment, niced_where_gpu_bound
from layerslide.tuner.whatif import (
    STATE_BYTES_PER_PARAM,
)


def cmd_profiles(args) -> int:
    profiles = builtin_profiles()
    if args.json:
        print_json([p.to_dict() for p in profiles])
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
        print_json([{**m.to_dict(), "total_params": m.total_params} for m in models])
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


def cmd_plan(args) -> int:
    writable_file("-o", args.output)
    plan = _build(args)
    if args.output:
        plan.save(args.output)
    summary = _plan_summary(plan)
    if args.json:
        print_json(summary)
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
        print_json(pred.summary())
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
