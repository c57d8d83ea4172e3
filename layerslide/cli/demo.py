"""demo: plan + simulate + tune + what-if for a built-in model on a built-in profile, written to a
report folder (figures, tables, traces, the tuned plan and a README that links them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from layerslide.cli.options import gib
from layerslide.hwprofiles import builtin_one_gpu_profiles, load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.reports import (
    lane_summary,
    plot_memory,
    plot_timeline,
    plot_tuning_heatmap,
    plot_whatif,
    write_chrome_trace,
    write_table,
)
from layerslide.simulator import simulate
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.whatif import across_profiles

DEMO_MODEL = "llama-3.2-3b"
DEMO_PROFILE = "h200-bench"
DEMO_GPU_CAP_BYTES = 24 * 1024**3  # the big card standing in for a 24 GiB consumer one
# one micro-batch a step: the demo's sweep stays a few minutes on two cores
DEMO_SPACE = SearchSpace(windows=(1, 2, 4, 8), micro_batches=(1, 2, 4, 8, 16, 32, 64),
                         grad_accums=(1,), activations=("gpu", "host"),
                         casts=("cpu_once", "gpu"))


def _gib(nbytes: float) -> str:
    return f"{gib(nbytes):.1f} GiB"


def run_demo(out: Path, log=print, exhaustive: bool = False) -> Path:
    """Write the demo report into `out` and return the path of its README (exhaustive: every
    candidate of each tune simulated, as tune --exhaustive)."""
    out.mkdir(parents=True, exist_ok=True)
    model, profile = PRESETS[DEMO_MODEL], load_profile(DEMO_PROFILE)
    cap = DEMO_GPU_CAP_BYTES

    log(f"1/4 plan + simulate {model.name} (micro-batch 8, default policy) on {profile.name}")
    train, policy = TrainSpec(micro_batch=8, seq_len=1024), Policy.of()
    plan = build_plan(model, train, policy)
    plan.save(out / "plan_default.json")
    default = simulate(plan, profile, gpu_memory_bytes=cap, label="default policy, micro-batch 8")

    log(f"2/4 tune window x micro-batch x activations x cast ({DEMO_SPACE.windows}, "
        f"{DEMO_SPACE.micro_batches}) under a {_gib(cap)} GPU cap")
    result = tune(model, profile, space=DEMO_SPACE, gpu_memory_bytes=cap, exhaustive=exhaustive)
    table = pd.DataFrame([c.row() for c in result.candidates])
    write_table(table, out / "tuning")
    plot_tuning_heatmap(table, out / "tuning_heatmap.png",
                        title=f"{model.name} on {profile.name}: best tokens/s per cell")
    best = result.best
    assert best is not None and result.best_plan is not None, "the demo config always fits"
    result.best_plan.save(out / "plan_tuned.json")
    tuned = simulate(result.best_plan, profile, gpu_memory_bytes=cap, label="tuned")

    log("3/4 what-if: the same model on every built-in profile of one GPU")
    rows = across_profiles(model, builtin_one_gpu_profiles(), gpu_memory_bytes=None, exhaustive=exhaustive,
                           progress=lambda done, total: log(f"    {done}/{total} profiles tuned"))
    whatif = pd.DataFrame([r.row() for r in rows])
    write_table(whatif, out / "whatif_profiles")
    plot_whatif(whatif, out / "whatif_profiles.png", title=f"{model.name}: best tokens/s per profile")

    log("4/4 figures, traces and tables")
    for name, pred in (("default", default), ("tuned", tuned)):
        plot_timeline(pred.trace, out / f"timeline_{name}.png",
                      title=f"{model.name} on {profile.name}: {pred.label}")
        plot_memory(pred.trace, out / f"memory_{name}.png", limits_bytes=pred.limits_bytes)
        write_chrome_trace(pred.trace, out / f"trace_{name}.json")
        pred.trace.save(out / f"trace_{name}.layerslide.json")
        write_table(lane_summary(pred.trace), out / f"lanes_{name}")

    summary = pd.DataFrame([{**p.summary(), "lane_busy": None} for p in (default, tuned)])
    write_table(summary.drop(columns=["lane_busy"]), out / "predictions")
    readme = out / "README.md"
    readme.write_text(_readme(model.name, profile.name, cap, default, tuned, best.row(), result))
    return readme


def _readme(model, profile, cap, default, tuned, best, result) -> str:
    def line(p):
        return (f"{p.step_s:.3f} s/step, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, "
                f"bottleneck {p.bottleneck}, peak GPU {_gib(p.peak_bytes['gpu'])}, "
                f"peak host {_gib(p.peak_bytes['host'])}")

    rejected = ", ".join(f"{n} over {t}" for t, n in result.rejections().items()) or "none"
    return f"""# layerslide demo: {model} on {profile} (GPU capped at {_gib(cap)})

Simulated, not measured: predictions of the SimPy model from the hardware profile.

- Default policy, micro-batch 8: {line(default)}
- Tuned (micro-batch {best['micro_batch']}, window {best['window']}, activations on
  {best['activations']}, cast {best['cast']}, {best['gpu_updated_blocks']} blocks updated on the
  GPU{' (decoder layers first)' if best['gpu_updated_order'] == 'layers_first' else ''}):
  {line(tuned)}
- Tuning: {len(result.candidates)} candidates simulated, {len(result.feasible)} fit; rejected:
  {rejected}; {result.bounded} more not simulated (their bound could not beat the best)

| file | what |
| --- | --- |
| timeline_default.png, timeline_tuned.png | one row per lane (GPU, H2D, D2H, CPU, NVMe) |
| memory_default.png, memory_tuned.png | bytes in use per tier over time, with limits |
| tuning_heatmap.png, tuning.csv/.md | best tokens/s per window x micro-batch of the candidates simulated (x: none of them fits, or none could beat the best) |
| whatif_profiles.png, whatif_profiles.csv/.md | the model on every built-in profile of one GPU |
| trace_*.json | Chrome/Perfetto traces: open in https://ui.perfetto.dev |
| trace_*.layerslide.json | the same traces in layerslide's schema |
| lanes_*.csv/.md, predictions.csv/.md | busy time per lane; prediction summaries |
| plan_default.json, plan_tuned.json | the plans, as data (`layerslide simulate --plan`) |
"""
