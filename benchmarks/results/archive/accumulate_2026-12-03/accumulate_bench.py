"""A micro-batch's bf16 grads into the host's fp32 sum (step-major accumulation), torch's
mixed-dtype copy_/add_ against the native kernel, side by side on one block of a given size:
median seconds of each and their ratio."""

import argparse
import json
import statistics
import time

import torch

from layerslide.executor.native import load_kernels


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=float, default=105e6, help="elements (a Qwen3-4B layer)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out")
    args = parser.parse_args()
    n = int(args.params)
    kernels = load_kernels()
    total = torch.zeros(n)
    grads = torch.randn(n).to(torch.bfloat16)
    row = {"elements": n, "torch_threads": torch.get_num_threads()}
    row["torch_copy_s"] = median_s(lambda: total.copy_(grads), args.repeats)
    row["torch_add_s"] = median_s(lambda: total.add_(grads), args.repeats)
    row["native_first_s"] = median_s(lambda: kernels.accumulate(total, grads, first=True),
                                     args.repeats)
    row["native_add_s"] = median_s(lambda: kernels.accumulate(total, grads, first=False),
                                   args.repeats)
    row["add_speedup"] = row["torch_add_s"] / row["native_add_s"]
    row["copy_speedup"] = row["torch_copy_s"] / row["native_first_s"]
    row["native_add_gb_per_s"] = n * 10 / row["native_add_s"] / 1e9  # reads 4+2 B, writes 4 B
    print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
