"""How fast tune answers, side by side: the exhaustive search (every candidate simulated, the 16
fastest filled, settled and niced: tune(exhaustive=True)) against the best-first one (tune's
default), in one process, on fixed (model, profile, GPU cap, search space) cases; and whether
they pick the same.

    python benchmarks/planning_speed.py --set speed --out DIR     # the timed cases (issue 49)
    python benchmarks/planning_speed.py --set quality --out DIR   # 48 cases: pick quality
    python benchmarks/planning_speed.py --set smoke --out DIR     # two small cases (tests)

Each case runs both searches in turn in the same process (exhaustive first), with `--workers`
processes each (speed: every core; quality: one, with `--jobs` cases at a time). A case
records each search's wall and CPU seconds (its own and its workers'), how many candidates it
simulated, its pick (tokens/s and settings) and whether the picks are identical (the same
settings, hence the same prediction) and the fast one's tokens/s over the exhaustive one's.
Writes DIR/planning_speed.json and DIR/planning_speed.md (the table and the command).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from layerslide.hwprofiles import builtin_profiles, load_profile
from layerslide.planner import PRESETS
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.purchase import PURCHASE_SPACE
from layerslide.tuner.whatif import WHATIF_SPACE

GIB = 1024**3
# a space of every kind of choice the default one has, a fifth of its size
SMALL_SPACE = SearchSpace(windows=(1, 2, 4), micro_batches=(1, 4, 16), grad_accums=(1, 4),
                          activations=("gpu", "host"), casts=("cpu_once", "gpu"))
SPACES = {"default": SearchSpace(), "whatif": WHATIF_SPACE, "purchase": PURCHASE_SPACE,
          "small": SMALL_SPACE}

# (model, profile, GPU cap in GiB or None, space)
SPEED_CASES = (
    ("llama-3.2-3b", "h200-bench", None, "default"),
    ("qwen3-32b", "rtx4090-256gb", 24, "default"),
    ("mistral-large-123b", "rtx4090-256gb", 24, "default"),
    ("llama-3.2-3b", "rtx4090-256gb", None, "whatif"),
    ("llama-3.1-70b", "workstation-8ch", None, "purchase"),
)
SMOKE_CASES = (
    ("llama-3.2-1b", "rtx4090-256gb", None, "purchase"),
    ("llama-3.2-1b", "h200-bench", 24, "purchase"),
)


# the quality set's models by size, each taken in turn across the profiles
SMALL_MODELS = ("llama-3.2-3b", "qwen3-4b")
MID_MODELS = ("mistral-7b", "llama-3.1-8b", "qwen3-8b")
LARGE_MODELS = ("mistral-nemo-12b", "qwen3-14b", "qwen3-32b")
HUGE_MODELS = ("llama-3.1-70b", "qwen2.5-72b", "mistral-large-123b")


def quality_cases() -> tuple[tuple, ...]:
    """Four cases per built-in profile, 3B to 123B: a 3-4B model capped at 24 GiB over
    SMALL_SPACE, a 7-8B one over what-if's space, a 12-32B one over the purchase search's
    (capped at 32 GiB on every other profile) and a 70-123B one over the purchase search's."""
    cases = []
    for i, profile in enumerate(p.name for p in builtin_profiles()):
        cases.append((SMALL_MODELS[i % 2], profile, 24, "small"))
        cases.append((MID_MODELS[i % 3], profile, None, "whatif"))
        cases.append((LARGE_MODELS[i % 3], profile, 32 if i % 2 else None, "purchase"))
        cases.append((HUGE_MODELS[i % 3], profile, None, "purchase"))
    return tuple(cases)


def _cpu_s() -> float:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _search(case: tuple, exhaustive: bool, workers: int, tolerance: float) -> dict:
    model, profile, cap, space = case
    wall, cpu = time.perf_counter(), _cpu_s()
    result = tune(PRESETS[model], load_profile(profile), space=SPACES[space],
                  gpu_memory_bytes=cap * GIB if cap else None, workers=workers,
                  exhaustive=exhaustive, tolerance=0.0 if exhaustive else tolerance)
    out = {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu_s() - cpu,
           "simulated": len(result.candidates), "searched": result.searched,
           "not_simulated": result.bounded, "tokens_per_s": None, "pick": None}
    best = result.best
    if best is not None:
        row = best.row()
        out["tokens_per_s"] = best.prediction.tokens_per_s
        out["pick"] = {k: row[k] for k in (
            "micro_batch", "grad_accum", "accumulation", "window", "activations", "cast",
            "moments_on_nvme", "master_on_nvme", "weights_on_nvme", "host_grad_buffers",
            "gpu_updated_blocks", "gpu_updated_order", "cpu_nice")}
    return out


def run_case(case: tuple, workers: int, tolerance: float) -> dict:
    exhaustive = _search(case, True, workers, tolerance)
    fast = _search(case, False, workers, tolerance)
    ratio = (fast["tokens_per_s"] / exhaustive["tokens_per_s"]
             if fast["tokens_per_s"] and exhaustive["tokens_per_s"] else None)
    both_none = fast["tokens_per_s"] is None and exhaustive["tokens_per_s"] is None
    model, profile, cap, space = case
    row = {"model": model, "profile": profile, "gpu_cap_gib": cap, "space": space,
           "exhaustive": exhaustive, "fast": fast, "tokens_per_s_ratio": ratio,
           "identical": both_none or (fast["pick"] == exhaustive["pick"]
                                      and fast["tokens_per_s"] == exhaustive["tokens_per_s"]),
           "wall_speedup": exhaustive["wall_s"] / fast["wall_s"],
           "cpu_speedup": exhaustive["cpu_s"] / max(fast["cpu_s"], 1e-9)}
    print(f"{model} on {profile} cap {cap} {space}: exhaustive {exhaustive['wall_s']:.1f} s "
          f"({exhaustive['simulated']} simulated), fast {fast['wall_s']:.1f} s "
          f"({fast['simulated']}); tokens/s {exhaustive['tokens_per_s']} vs "
          f"{fast['tokens_per_s']}; identical {row['identical']}", flush=True)
    return row


def _case_args(args: tuple) -> dict:
    return run_case(*args)


def summary(rows: list[dict]) -> dict:
    ratios = [r["tokens_per_s_ratio"] for r in rows if r["tokens_per_s_ratio"] is not None]
    fits_differ = sum(1 for r in rows if (r["fast"]["tokens_per_s"] is None)
                      != (r["exhaustive"]["tokens_per_s"] is None))
    return {
        "cases": len(rows),
        "identical": sum(r["identical"] for r in rows),
        "identical_fraction": sum(r["identical"] for r in rows) / len(rows),
        "min_tokens_per_s_ratio": min(ratios, default=None),
        # picks that differ: the fast one faster (the exhaustive search gives its later stages
        # to its 16 sweep leaders only) or slower
        "fast_faster": sum(1 for r in ratios if r > 1),
        "fast_slower": sum(1 for r in ratios if r < 1),
        "fits_differ": fits_differ,
        "exhaustive_wall_s": sum(r["exhaustive"]["wall_s"] for r in rows),
        "fast_wall_s": sum(r["fast"]["wall_s"] for r in rows),
        "exhaustive_cpu_s": sum(r["exhaustive"]["cpu_s"] for r in rows),
        "fast_cpu_s": sum(r["fast"]["cpu_s"] for r in rows),
        "exhaustive_simulated": sum(r["exhaustive"]["simulated"] for r in rows),
        "fast_simulated": sum(r["fast"]["simulated"] for r in rows),
    }


def markdown(rows: list[dict], total: dict, command: str, header: str) -> str:
    lines = [f"# Planning speed: {header}", "", f"Command: `{command}`", "",
             ("| model | profile | GPU cap | space | exhaustive s (simulated) | fast s "
             "(simulated) | speedup | tokens/s exhaustive | fast / exhaustive | identical |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        e, f = r["exhaustive"], r["fast"]
        tps = f"{e['tokens_per_s']:.1f}" if e["tokens_per_s"] else "none fits"
        ratio = f"{r['tokens_per_s_ratio']:.4f}" if r["tokens_per_s_ratio"] else "-"
        lines.append(f"| {r['model']} | {r['profile']} | {r['gpu_cap_gib'] or '-'} | "
                     f"{r['space']} | {e['wall_s']:.1f} ({e['simulated']}) | "
                     f"{f['wall_s']:.1f} ({f['simulated']}) | {r['wall_speedup']:.1f}x | {tps} "
                     f"| {ratio} | {'yes' if r['identical'] else 'NO'} |")
    lines += ["", (f"{total['identical']} of {total['cases']} picks identical ("
              f"{total['fast_faster']} faster, {total['fast_slower']} slower); the fast pick's "
              f"tokens/s at least {total['min_tokens_per_s_ratio']:.4f} of the exhaustive one's; "
              f"wall {total['exhaustive_wall_s']:.0f} s exhaustive, {total['fast_wall_s']:.0f} s "
              f"fast; CPU {total['exhaustive_cpu_s']:.0f} s and {total['fast_cpu_s']:.0f} s; "
              f"{total['exhaustive_simulated']} and {total['fast_simulated']} candidates "
              "simulated.")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("speed", "quality", "smoke"), default="speed")
    parser.add_argument("--out", required=True, help="folder for planning_speed.json/.md")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes per search (default: speed every core, else 1)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="cases at once (default: quality and smoke every core, speed 1)")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="the fast search's tolerance (a fraction; default 0: exact)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    cases = {"speed": SPEED_CASES, "quality": quality_cases(), "smoke": SMOKE_CASES}[args.set]
    workers = args.workers or (cores if args.set == "speed" else 1)
    jobs = args.jobs or (1 if args.set == "speed" else cores)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            rows = list(pool.map(_case_args, [(c, workers, args.tolerance) for c in cases]))
    else:
        rows = [run_case(c, workers, args.tolerance) for c in cases]
    total = summary(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(["benchmarks/planning_speed.py", *sys.argv[1:]])
    header = (f"{args.set} cases, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}: "
              f"{cores} cores, load average {os.getloadavg()[0]:.1f} at the end, {workers} "
              f"worker(s) per search, {jobs} case(s) at once, tolerance {args.tolerance:g}")
    (out / "planning_speed.json").write_text(json.dumps(
        {"set": args.set, "workers": workers, "jobs": jobs, "tolerance": args.tolerance,
         "cores": cores, "command": command, "summary": total, "cases": rows},
        indent=1, default=str) + "\n")
    (out / "planning_speed.md").write_text(markdown(rows, total, command, header))
    print(markdown(rows, total, command, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
