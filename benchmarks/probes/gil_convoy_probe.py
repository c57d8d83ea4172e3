"""Why a GPU lane's enqueue slows beside the CPU AdamW (issue 26), reproduced on any Linux host.

In training, Qwen3-4B's layer-major backward took 1.4-1.8x longer to enqueue beside the CPU
AdamW than without it (validation_2026-12-04b), where a layer's passes enqueued beside AdamW
alone did not slow (validation_2026-12-04 call1). What training adds is the other lanes' threads
waking every 0.2 ms (engine.POLL_S) to look at GPU events, each taking the GIL. Here a thread
runs tiny torch ops on the CPU (a launch loop's Python and dispatcher path, holding the GIL),
beside the native cast on every core (it releases the GIL, as AdamW does) and threads that
sleep POLL_S and take the GIL; each row is its op time over the loop's alone. Ratios only.

    python benchmarks/probes/gil_convoy_probe.py --out R/gil_convoy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from layerslide.executor.native import load_kernels

OPS, ROUNDS = 20000, 5


def op_us(*, kernel_threads: int, pollers: int, poll_s: float = 2e-4, nice: int = 0,
          switch_s: float = 2e-4) -> float:
    """Median microseconds per tiny op over ROUNDS of OPS, with the cast on `kernel_threads`
    threads (0: none) and `pollers` threads taking the GIL every poll_s beside it."""
    sys.setswitchinterval(switch_s)
    kernels = load_kernels(threads=kernel_threads, nice=nice)
    src = torch.randn(1 << 24)
    dst = torch.empty(src.shape, dtype=torch.bfloat16)
    stop = threading.Event()

    def cast() -> None:
        while not stop.is_set():
            kernels.cast(src, dst)

    def poll() -> None:
        while not stop.is_set():
            time.sleep(poll_s)

    threads = ([threading.Thread(target=cast)] if kernel_threads else [])
    threads += [threading.Thread(target=poll) for _ in range(pollers)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    tiny, per_round = torch.zeros(1), []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(OPS):
            tiny.add_(1)
        per_round.append((time.perf_counter() - start) / OPS * 1e6)
    stop.set()
    for t in threads:
        t.join()
    return statistics.median(per_round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pollers", type=int, default=2)
    ap.add_argument("--nice", type=int, default=19, help="the niced row's worker niceness")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if load_kernels() is None:
        raise SystemExit("the native kernels did not build: no C compiler")
    cores = os.cpu_count() or 1
    alone = op_us(kernel_threads=0, pollers=0)
    every = {"kernel_threads": cores, "pollers": args.pollers}
    rows = {"pollers alone": {"kernel_threads": 0, "pollers": args.pollers},
            "kernel on every core": {"kernel_threads": cores, "pollers": 0},
            "kernel on every core + pollers": every,
            "kernel on one core fewer + pollers": {**every, "kernel_threads": max(cores - 1, 1)},
            "... pollers every 1 ms": {**every, "poll_s": 1e-3},
            "... pollers every 5 ms": {**every, "poll_s": 5e-3},
            "... GIL switch interval 5 ms": {**every, "switch_s": 5e-3}}
    found = {"cores": cores, "alone_us": round(alone, 3), "slowdown": {}}
    for name, setting in rows.items():
        found["slowdown"][name] = round(op_us(**setting) / alone, 3)
        print(f"{name}: x{found['slowdown'][name]:.2f}", flush=True)
    # last: a worker's niceness cannot be lowered again in this process
    niced = f"kernel on every core, workers at nice {args.nice} + pollers"
    found["slowdown"][niced] = round(op_us(kernel_threads=cores, pollers=args.pollers,
                                           nice=args.nice) / alone, 3)
    print(f"{niced}: x{found['slowdown'][niced]:.2f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
