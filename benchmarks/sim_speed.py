"""How fast the planner and simulator are: one step of Mistral-Large-123B (88 layers) with the
default policy, a tuning sweep of 504 configurations of Llama-3.1-8B, and, on the plan tune
picks for Llama-3.1-70B on h100-pcie, the simulator's own event kernel against
simpy.Environment (the same trace from both) and a search's untraced run in C
(simulator.native) against the Python engine (the same markers, spans and peaks);
`--kernel-only` runs just those two.

Targets (issue 2): the 123B step simulates in under 1 s and 500 configurations in under 60 s
on a 2-core machine. Prints its figures; with --out, writes them as markdown to that file.

    .venv/bin/python benchmarks/sim_speed.py --out benchmarks/results/sim_speed.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

import simpy

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, native, run_plan, simulate
from layerslide.simulator.engine import simulate_run
from layerslide.simulator.kernel import Kernel
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.plans import collector_paused

TIB = 1024**4


def time_big_step(repeats: int) -> list[str]:
    model = PRESETS["mistral-large-123b"]
    # 123B's state (~1.6 TiB with everything in RAM) needs a big host: what-if 2 TiB of RAM,
    # past what the box's board takes (its ram_max lifted)
    box = load_profile("rtx4090-256gb")
    box = dataclasses.replace(box, host=dataclasses.replace(box.host, ram_max_bytes=None))
    profile = box.with_overrides(ram_bytes=2 * TIB)
    train, policy = TrainSpec(micro_batch=4, seq_len=1024), Policy.of()
    builds, sims = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = build_plan(model, train, policy)
        t1 = time.perf_counter()
        pred = simulate(plan, profile)
        t2 = time.perf_counter()
        builds.append(t1 - t0)
        sims.append(t2 - t1)
    assert pred.step_s is not None
    steps = plan.num_steps
    build_s, sim_s = statistics.median(builds), statistics.median(sims)
    return [
        ("Mistral-Large-123B, micro-batch 4, seq 1024, default policy, rtx4090-256gb with 2 TiB "
         f"RAM: {plan.graph.number_of_nodes()} tasks over {steps} planned steps"),
        f"- build_plan: {build_s:.3f} s; simulate: {sim_s:.3f} s (median of {repeats})",
        (f"- per simulated training step: {(build_s + sim_s) / steps:.3f} s "
         f"(target < 1 s); whole 3-step plan {build_s + sim_s:.3f} s"),
        (f"- prediction: {pred.step_s:.1f} s/step, {pred.tokens_per_s:.0f} tokens/s, "
         f"bottleneck {pred.bottleneck}"),
    ]


# the plan `tune --model llama-3.1-70b --profile h100-pcie` picks (planning-speed results)
TUNED_70B = (TrainSpec(micro_batch=4, grad_accum=64, seq_len=1024),
             Policy.of(accumulation="layer_major", window=1, activations="nvme", cast="gpu",
                       moments_on_nvme=1.0, gpu_updated_blocks=3))


def time_kernel_vs_simpy(repeats: int) -> list[str]:
    """The 70B plan run on simpy.Environment and on simulator.kernel.Kernel, alternately, with
    the cycle collector off as a tune runs them: the median CPU seconds of each and their
    ratio; the two traces must be the same."""
    plan = build_plan(PRESETS["llama-3.1-70b"], *TUNED_70B)
    costs = CostModel(load_profile("h100-pcie"))
    seconds: dict[type, list[float]] = {simpy.Environment: [], Kernel: []}
    traces = {}
    with collector_paused():
        for _ in range(repeats):
            for environment, taken in seconds.items():  # alternated: the same machine
                t0 = time.process_time()
                traces[environment] = run_plan(plan, costs, environment=environment)
                taken.append(time.process_time() - t0)
    theirs, ours = traces[simpy.Environment], traces[Kernel]
    same = (theirs.events == ours.events and theirs.memory == ours.memory
            and theirs.meta == ours.meta)
    assert same, "the kernel's trace differs from simpy.Environment's"
    simpy_s, kernel_s = (statistics.median(seconds[e]) for e in (simpy.Environment, Kernel))
    return [(f"- Llama-3.1-70B as tuned for h100-pcie ({plan.graph.number_of_nodes()} tasks), "
             f"run_plan on simpy.Environment: {simpy_s:.3f} s CPU; on simulator.kernel.Kernel: "
             f"{kernel_s:.3f} s; {simpy_s / kernel_s:.2f}x (median of {repeats}, alternated, "
             "cycle collector off); "
             f"traces identical: {same}")]


def time_native_vs_python(repeats: int) -> list[str]:
    """The 70B plan's untraced run (a search's) by the Python engine and by the C one,
    alternately, the cycle collector off: the median CPU seconds of each and their ratio; the
    two runs must be the same."""
    plan = build_plan(PRESETS["llama-3.1-70b"], *TUNED_70B, validate=False)
    costs = CostModel(load_profile("h100-pcie"))
    if not native.available():
        return ["- the C engine: not built here (no C compiler, or LAYERSLIDE_NATIVE=0)"]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    runs = {}
    with collector_paused():
        for _ in range(repeats):
            for in_c, taken in seconds.items():
                t0 = time.process_time()
                runs[in_c] = simulate_run(plan, costs, keep_memory=False, keep_events=False,
                                          native=in_c)
                taken.append(time.process_time() - t0)
    python, c = runs[False], runs[True]
    same = (python.marker_ends_s == c.marker_ends_s and python.spans == c.spans
            and python.trace.meta == c.trace.meta)
    assert same, "the C engine's run differs from the Python engine's"
    python_s, c_s = statistics.median(seconds[False]), statistics.median(seconds[True])
    return [(f"- the same plan's untraced run (a search's), Python engine: {python_s:.3f} s CPU; "
             f"C engine (simulator.native, its marshalling included): {c_s:.3f} s; "
             f"{python_s / c_s:.1f}x (median of {repeats}, alternated, cycle collector off); "
             f"markers, spans and peaks identical: {same}")]


SWEEP = SearchSpace(windows=(1, 2, 4, 8), micro_batches=(1, 2, 4, 8, 16, 32, 64),
                    grad_accums=(1, 2, 4), activations=("gpu", "host"),
                    casts=("cpu_once", "cpu_per_load", "gpu"))


def time_plain_sweep(count: int = 500) -> tuple[int, float]:
    """build_plan + simulate of `count` distinct configurations, one after another."""
    model, profile = PRESETS["llama-3.1-8b"], load_profile("h200-bench")
    configs = list(SWEEP.candidates(1024, None, Policy.of()))[:count]
    t0 = time.perf_counter()
    for train, policy in configs:
        simulate(build_plan(model, train, policy), profile, gpu_memory_bytes=24 * 1024**3)
    return len(configs), time.perf_counter() - t0


def time_sweep(workers: int) -> tuple[int, float]:
    space = SWEEP
    t0 = time.perf_counter()
    result = tune(PRESETS["llama-3.1-8b"], load_profile("h200-bench"), space=space,
                  gpu_memory_bytes=24 * 1024**3, workers=workers)
    return len(result.candidates), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the results as markdown to this file")
    parser.add_argument("--kernel-only", action="store_true",
                        help="time only the event kernel against simpy.Environment and the C "
                        "engine against the Python one")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    lines = [(f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}: "
              f"{cores} cores, Python {platform.python_version()}"),
             "", f"Command: `python benchmarks/sim_speed.py {' '.join(sys.argv[1:])}`", ""]
    lines += time_kernel_vs_simpy(args.repeats)
    lines += time_native_vs_python(args.repeats)
    if not args.kernel_only:
        lines += _planner_and_tuner_lines(args.repeats, cores)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Simulator speed\n\n" + text)


def _planner_and_tuner_lines(repeats: int, cores: int) -> list[str]:
    lines = time_big_step(repeats)
    n, seconds = time_plain_sweep()
    lines.append(f"- build_plan + simulate of {n} distinct Llama-3.1-8B configurations (window, "
                 f"micro-batch 1-64, accumulation 1-4, activations, cast), one process: "
                 f"{seconds:.1f} s ({seconds / n * 1000:.0f} ms each; target 500 in < 60 s)")
    for workers in sorted({1, cores}):
        n, seconds = time_sweep(workers)
        lines.append(f"- tune over the same space (each candidate also tries NVMe placement, "
                     f"grad-buffer bounds and GPU-updated blocks: 1-3 simulations), capped at "
                     f"24 GiB: {n} candidates in {seconds:.1f} s with {workers} worker(s) "
                     f"({seconds / n * 1000:.0f} ms each)")
    return lines


if __name__ == "__main__":
    main()
