"""Measure the CPU side of a step on the H200 benchmark machine: fused AdamW and the fp32->bf16
cast at several thread counts, alone and running at once in two processes (the optimizer
worker and a cast worker), to see what splitting the cores between them buys.

Run there (writes $OUT/cpu_probe.json and prints a summary):
    python3 benchmarks/probes/h200_cpu_probe.py --out "$OUT/cpu_probe.json"
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

PARAMS = 128 * 1024**2  # fp32 params per buffer: 512 MiB each, far past the caches
RUN_S = 4.0


def _adamw_rate(threads: int, start, seconds: float) -> float:
    """Params per second of torch's fused CPU AdamW over PARAMS params."""
    import torch

    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(PARAMS))
    p.grad = torch.randn(PARAMS)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    opt.step()  # warm-up, allocates the moments
    if start is not None:
        start.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        opt.step()
        steps += 1
    return steps * PARAMS / (time.perf_counter() - t0)


def _cast_rate(threads: int, start, seconds: float) -> float:
    """fp32 bytes read per second of an fp32 -> bf16 copy."""
    import torch

    torch.set_num_threads(threads)
    src = torch.randn(PARAMS)
    dst = torch.empty(PARAMS, dtype=torch.bfloat16)
    dst.copy_(src)
    if start is not None:
        start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dst.copy_(src)
        n += 1
    return n * PARAMS * 4 / (time.perf_counter() - t0)


def _worker(kind: str, threads: int, start, results) -> None:
    fn = _adamw_rate if kind == "adamw" else _cast_rate
    results[kind] = fn(threads, start, RUN_S)


def together(adamw_threads: int, cast_threads: int) -> dict:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_worker, args=("adamw", adamw_threads, start, results)),
                 ctx.Process(target=_worker, args=("cast", cast_threads, start, results))]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return {"adamw_params_per_s": results["adamw"], "cast_bytes_per_s": results["cast"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = {"params_per_buffer": PARAMS, "alone": {}, "together": {}}
    for threads in (4, 8, 12, 16):
        ctx = mp.get_context("spawn")
        with ctx.Pool(1) as pool:  # a fresh process per thread count
            adamw = pool.apply(_adamw_rate, (threads, None, RUN_S))
            cast = pool.apply(_cast_rate, (threads, None, RUN_S))
        out["alone"][threads] = {"adamw_params_per_s": adamw, "cast_bytes_per_s": cast}
        print(f"alone {threads:2d} threads: AdamW {adamw / 1e9:.2f} Gparam/s, "
              f"cast {cast / 1e9:.1f} GB/s read", flush=True)
    for a, c in ((16, 16), (12, 4), (8, 8)):
        r = together(a, c)
        out["together"][f"{a}+{c}"] = r
        print(f"together AdamW {a} threads + cast {c} threads: AdamW "
              f"{r['adamw_params_per_s'] / 1e9:.2f} Gparam/s, cast "
              f"{r['cast_bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
