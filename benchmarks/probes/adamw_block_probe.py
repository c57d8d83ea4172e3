"""Does the CPU AdamW's rate depend on the block it updates? In training the embedding's step
(263 M params at 1B, 394 M at 3B) ran 5.0-5.9 Gparam/s where the decoder layers' (61 M, 101 M)
ran 4.0-5.4 on the same machine, and calibrate's figure (blocks of 64 Mi) was 4.6-4.85
(dev/HISTORY.md, session 11). One run, side by side:

- the executor's native AdamW (calibrate.host.adamw_blocks: bf16 grads in, bf16 weights out)
  over 2 arrays of each block size in turn, each call timed; the sizes take turns round by
  round so that the machine's drift falls on all of them alike;
- the same beside a thread that dispatches tiny CUDA kernels without pause, as the executor's
  GPU lane does at micro-batch 1 (skipped without CUDA). A Python thread, as the executor's
  is: what AdamW loses beside it may include handing the GIL back, not only a core;
- calibrate's own AdamW measurement (calibrate.host.adamw_throughput) at the start, middle and
  end of the run: how far apart it lands within one machine's few minutes;
- with --drift N: that measurement N times back to back, then N times 3 s apart (does the rate
  climb with AdamW's own activity, or with the process's age?).

Per size: the median call time, its rate, and t = t0 + n / r fitted over the sizes.
Writes JSON to --out; prints a table.
    python benchmarks/probes/adamw_block_probe.py --out R/adamw_blocks.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from layerslide.calibrate.host import adamw_blocks, adamw_throughput

# 16 Mi, 1B layer, calibrate's 64 Mi, 3B layer, 1B embedding, 3B embedding
SIZES = (16 * 2**20, 60_821_504, 64 * 2**20, 100_669_440, 262_668_288, 394_002_432)
ARRAYS = 2
CALLS_PER_ROUND = 2 * ARRAYS


def timed_calls(steps, calls: int) -> list[float]:
    """Seconds of each of `calls` AdamW calls over the arrays in turn."""
    out = []
    for i in range(calls):
        start = time.perf_counter()
        steps[i % len(steps)]()
        out.append(time.perf_counter() - start)
    return out


class Dispatcher:
    """A thread launching tiny CUDA kernels back to back (the GPU lane at micro-batch 1)."""

    def __init__(self):
        self.stop = threading.Event()
        self.launches = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tiny = torch.zeros(1, device="cuda")
        while not self.stop.is_set():
            for _ in range(100):
                tiny.add_(1)
            self.launches += 100
            torch.cuda.synchronize()

    def __enter__(self):
        self.started_s = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


PROCESS_START = time.perf_counter()


def drift(samples: int, pause_s: float) -> list[tuple[float, float]]:
    """(seconds since the process started, calibrate's AdamW rate) for each sample."""
    found = []
    for _ in range(samples):
        rate = adamw_throughput(4 * 64 * 2**20, 10).value
        found.append((time.perf_counter() - PROCESS_START, rate))
        time.sleep(pause_s)
    return found


def sweep(blocks: dict[int, list], rounds: int) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {n: [] for n in blocks}
    order = list(blocks)
    for r in range(rounds):
        for n in order[r % len(order):] + order[:r % len(order)]:
            times[n] += timed_calls(blocks[n], CALLS_PER_ROUND)
    return times


def summary(times: dict[int, list[float]]) -> dict:
    rows = {str(n): {"median_s": statistics.median(t),
                     "rate_params_per_s": n / statistics.median(t),
                     "min_s": min(t), "max_s": max(t), "calls": len(t)}
            for n, t in times.items()}
    n = np.array(list(times), dtype=float)
    t = np.array([statistics.median(v) for v in times.values()])
    slope, t0 = np.polyfit(n, t, 1)
    return {"by_size": rows, "fit_t0_s": float(t0), "fit_rate_params_per_s": float(1 / slope)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-params", type=int, default=max(SIZES),
                        help="leave out larger blocks (a smoke test on a small machine)")
    parser.add_argument("--drift", type=int, default=0, metavar="N")
    parser.add_argument("--drift-only", action="store_true", help="no block sweeps")
    args = parser.parse_args()
    if sum(n <= args.max_params for n in SIZES) < 2 and not args.drift_only:
        parser.error(f"--max-params {args.max_params} leaves fewer than 2 block sizes to fit "
                     f"(the smallest is {min(SIZES)})")
    found: dict = {"threads": torch.get_num_threads(), "calibrate_adamw": []}
    if args.drift:
        found["drift_back_to_back"] = drift(args.drift, pause_s=0.0)
        found["drift_spaced_3s"] = drift(args.drift, pause_s=3.0)
        for key in ("drift_back_to_back", "drift_spaced_3s"):
            print(f"{key}, G/s (seconds since start):", " ".join(
                f"{rate / 1e9:.2f}({at:.0f})" for at, rate in found[key]))
    if args.drift_only:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1))
        return
    found["calibrate_adamw"].append(adamw_throughput(4 * 64 * 2**20, 10).value)
    blocks, kernel = {}, ""
    for n in (n for n in SIZES if n <= args.max_params):
        blocks[n], kernel = adamw_blocks(n, ARRAYS)
        timed_calls(blocks[n], ARRAYS)  # first touch and warm-up
    found["kernel"] = kernel
    found["alone"] = summary(sweep(blocks, args.rounds))
    found["calibrate_adamw"].append(adamw_throughput(4 * 64 * 2**20, 10).value)
    if torch.cuda.is_available():
        with Dispatcher() as spinning:
            found["beside_dispatch"] = summary(sweep(blocks, args.rounds))
            found["dispatch_launches_per_s"] = spinning.launches / (
                time.perf_counter() - spinning.started_s)
    found["calibrate_adamw"].append(adamw_throughput(4 * 64 * 2**20, 10).value)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1))
    print(kernel, f"{found['threads']} threads")
    print("calibrate's AdamW at start / middle / end, G/s:",
          " / ".join(f"{v / 1e9:.2f}" for v in found["calibrate_adamw"]))
    for mode in ("alone", "beside_dispatch"):
        if mode not in found:
            continue
        s = found[mode]
        print(f"{mode}: fit t0 {s['fit_t0_s'] * 1e3:.2f} ms, "
              f"r {s['fit_rate_params_per_s'] / 1e9:.2f} G/s")
        for n, row in s["by_size"].items():
            print(f"  {int(n) / 1e6:7.1f} M params: median {row['median_s'] * 1e3:7.2f} ms "
                  f"({row['rate_params_per_s'] / 1e9:.2f} G/s), min {row['min_s'] * 1e3:.2f}, "
                  f"max {row['max_s'] * 1e3:.2f}")
    if "dispatch_launches_per_s" in found:
        print(f"dispatching thread: {found['dispatch_launches_per_s']:.0f} launches/s")


if __name__ == "__main__":
    main()
