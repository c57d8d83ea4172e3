"""How the CPU AdamW and the copy engines slow each other down in host memory, one direction
at a time: the data behind the simulator's host-memory sharing (HostSpec: capacity, each
direction's cost per byte and weight), printed with the fit `layerslide calibrate` makes of it.

Runs calibrate.gpu.host_sharing_rates at a 3B decoder layer's block size (100 Mi params, 4
blocks) for longer and more rounds than calibrate does: AdamW alone; each copy direction alone;
AdamW beside H2D, beside D2H, beside both.

    python benchmarks/probes/host_sharing_probe.py --out R/host_sharing.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from layerslide.calibrate.gpu import host_sharing_rates
from layerslide.calibrate.sharing import fit_host_sharing

BLOCK_PARAMS = 100 * 2**20
COPY_BYTES = 256 * 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each mode's copies run")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rates = host_sharing_rates(BLOCK_PARAMS, COPY_BYTES, seconds=args.seconds,
                               rounds=args.rounds)
    fit = fit_host_sharing(rates)
    report = {"block_params": BLOCK_PARAMS, "copy_bytes": COPY_BYTES,
              "threads": torch.get_num_threads(), "median_bytes_per_s": rates,
              "fit": {m.key: m.value for m in fit}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    alone = rates["adamw"]["adamw"]
    print("| mode | AdamW GB/s | AdamW vs alone | H2D GB/s | D2H GB/s | total GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, got in rates.items():
        a, up, down = (got.get(k, 0.0) / 1e9 for k in ("adamw", "h2d", "d2h"))
        print(f"| {mode} | {a:.1f} | {a * 1e9 / alone:.2f} | {up:.1f} | {down:.1f} | "
              f"{a + up + down:.1f} |")
    print("fit: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" if v > 1e3 else f"{k} {v:.3f}"
                              for k, v in report["fit"].items()))


if __name__ == "__main__":
    main()
