"""Does a layer's GEMM work run faster when the GPU idles between layers?

At window 1 the validation's 3B micro-batch 16 row ran its forward and backward 13-14% faster
than the calibrated GEMM rates, while window 2 rows matched within 2%. At window 1 the GPU
waits for each layer's weights, so it idles between layers; a power-limited GPU may then hold
higher clocks. This runs one 3B layer's 21 GEMMs (forward and both backward products) at
micro-batch 8, 16 and 32 x sequence 1024 as calibrate times them (each GEMM 10 times back to
back) and as the executor issues them (one layer's sequence per burst), with idle gaps that make
the GPU busy 100%, 50% and 25% of the time, and samples the SM clock and power (nvidia-smi).

Run on the GPU machine (writes JSON and prints a table):
    python3 benchmarks/probes/gpu_duty_probe.py --out /tmp/traces/duty_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from layerslide.calibrate.gpu import layer_gemm_shapes
from layerslide.planner.model import resolve_model

# Llama-3.2-3B: (in, out) of q, k, v, o, gate, up, down, as calibrate measures them
LAYER_GEMMS = layer_gemm_shapes(resolve_model("llama-3.2-3b"))
TOKEN_COUNTS = (8 * 1024, 16 * 1024, 32 * 1024)  # micro-batch 8, 16, 32 at sequence 1024
BUSY_FRACTIONS = (1.0, 0.5, 0.25)


class ClockSampler:
    """SM clock (MHz) and board power (W) every ~0.1 s from nvidia-smi, while running."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                line = subprocess.run(
                    ["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                     "--format=csv,noheader,nounits"], check=False,
                    capture_output=True, text=True, timeout=5).stdout.splitlines()[0]
                clock, power = (float(v) for v in line.split(","))
                self.samples.append((clock, power))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return  # no nvidia-smi here: no clock column
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        return {"sm_clock_mhz_median": statistics.median(c for c, _ in self.samples),
                "power_w_median": statistics.median(p for _, p in self.samples)}


def layer_products(tokens: int) -> tuple[list, float]:
    """The layer's 21 GEMMs as closures over random bf16 operands, and their FLOPs."""
    dev = torch.device("cuda")
    products, flops = [], 0.0
    for k, n in LAYER_GEMMS:
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        products += [lambda x=x, w=w: x @ w.T, lambda dy=dy, w=w: dy @ w,
                     lambda dy=dy, x=x: dy.T @ x]
        flops += 3 * 2.0 * tokens * k * n
    return products, flops


def timed(fn, repeats: int = 1) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def calibrate_style(products) -> float:
    """Seconds for the layer as calibrate adds it up: each GEMM timed 10 times back to back."""
    total = 0.0
    for fn in products:
        fn()
        total += statistics.median(timed(fn, 10) for _ in range(5))
    return total


def bursts(products, busy_fraction: float, seconds: float) -> dict:
    """The layer's GEMMs issued in order as one burst, then the GPU left idle so that it is busy
    `busy_fraction` of the time, for about `seconds`; per-burst GPU time and clocks."""
    def layer() -> None:
        for fn in products:
            fn()

    burst_s = timed(layer)
    times = []
    with ClockSampler() as sampler:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            took = timed(layer)
            times.append(took)
            if busy_fraction < 1.0:
                time.sleep(took * (1.0 / busy_fraction - 1.0))
    steady = times[len(times) // 4:]  # after the clocks settled into this duty
    return {"busy_fraction": busy_fraction, "bursts": len(times), "first_burst_s": burst_s,
            "burst_s_median": statistics.median(steady), **sampler.summary()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.5, help="per token count and busy fraction")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for tokens in TOKEN_COUNTS:
        products, flops = layer_products(tokens)
        result = {"tokens": tokens, "layer_gemm_flops": flops,
                  "calibrate_style_s": calibrate_style(products),
                  "bursts": [bursts(products, f, args.seconds) for f in BUSY_FRACTIONS]}
        results.append(result)
        base = result["calibrate_style_s"]
        print(f"3B layer GEMMs at {tokens} tokens: calibrate-style {base * 1e3:.2f} ms "
              f"({flops / base / 1e12:.0f} TFLOP/s)")
        for row in result["bursts"]:
            print(f"  busy {row['busy_fraction']:.0%}: {row['burst_s_median'] * 1e3:.2f} ms "
                  f"({flops / row['burst_s_median'] / 1e12:.0f} TFLOP/s, "
                  f"{row['burst_s_median'] / base:.3f} x calibrate-style), "
                  f"SM {row.get('sm_clock_mhz_median', '-')} MHz, "
                  f"{row.get('power_w_median', '-')} W")
        del products
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
