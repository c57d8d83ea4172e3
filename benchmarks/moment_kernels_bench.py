"""The native one-pass AdamW per moment precision, side by side in one process: parameters per
second and the host bytes per second they imply (fp32 28 B/param, bf16 20, 8-bit ~16: bf16
grads in, bf16 weights out), rounds interleaved so that drift falls on all alike.

    python benchmarks/moment_kernels_bench.py [--numel 67108864] [--threads 0] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from layerslide.executor.moments import Moments, moment_seed
from layerslide.executor.native import load_kernels
from layerslide.planner.settings import MOMENT_PRECISIONS, moments_nbytes

HYPER = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


def traffic_bytes_per_param(precision: str, numel: int) -> float:
    """Read grad 2 and master 4, write master 4 and weights 2, moments read and written."""
    return 12 + 2 * moments_nbytes(numel, precision) / numel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("--threads", type=int, default=0, help="0: OpenMP's count")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    kernels = load_kernels(threads=args.threads)
    if kernels is None:
        raise SystemExit("no native kernels (no C compiler, or LAYERSLIDE_NATIVE=0)")
    n = args.numel
    param = torch.randn(n)
    grad = (torch.randn(n) * 1e-3).to(torch.bfloat16)
    weights = torch.empty(n, dtype=torch.bfloat16)
    moments = {p: Moments.zeros(p, n) for p in MOMENT_PRECISIONS}
    seconds: dict[str, list[float]] = {p: [] for p in MOMENT_PRECISIONS}
    for step in range(1, args.rounds + 2):  # the first round warms pages and caches
        for precision in MOMENT_PRECISIONS:
            start = time.perf_counter()
            kernels.adamw_step_moments(param=param, moments=moments[precision], grad=grad,
                                       weights_out=weights, decay_end=n, grad_scale=1.0,
                                       step=step, seed=moment_seed(0, step), **HYPER)
            if step > 1:
                seconds[precision].append(time.perf_counter() - start)
    results = {}
    for precision in MOMENT_PRECISIONS:
        best = min(seconds[precision])
        per_param = traffic_bytes_per_param(precision, n)
        results[precision] = {"best_s": best, "median_s": statistics.median(seconds[precision]),
                              "gparams_per_s": n / best / 1e9, "bytes_per_param": per_param,
                              "gb_per_s": n * per_param / best / 1e9}
    fp32 = results["fp32"]["best_s"]
    print(f"{n / 2**20:.0f} Mi params, threads {kernels.threads or 'all'} "
          f"({torch.get_num_threads()} torch threads), best of {args.rounds}")
    for precision, r in results.items():
        print(f"{precision:>5}: {r['gparams_per_s']:.2f} Gparam/s ({r['best_s'] * 1e3:.1f} ms, "
              f"median {r['median_s'] * 1e3:.1f}), {r['bytes_per_param']:.2f} B/param -> "
              f"{r['gb_per_s']:.0f} GB/s; {fp32 / r['best_s']:.2f}x fp32's rate")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"numel": n, "threads": args.threads, "rounds": args.rounds,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
