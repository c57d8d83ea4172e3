"""How the CPU AdamW and the copy engines slow each other down in host memory, one direction
at a time: the data behind the simulator's host-memory sharing (capacity and DMA weight).

For each mode (AdamW alone; each copy direction alone and both; AdamW beside H2D, beside D2H,
beside both) it streams pinned 256 MiB copies for about `--seconds` while the executor's native
AdamW runs back to back over 4 blocks of a 3B decoder layer's size (100 Mi params, 28 B/param),
and records each side's rate: AdamW's params/s over the calls that ended while every copy still
ran, each direction's bytes/s from CUDA events around its own copies. Repeated `--rounds`
times, modes interleaved, so a slow spell of the machine hits every mode alike.

    python benchmarks/host_sharing_probe.py --out R/host_sharing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from layerslide.calibrate.gpu import CopyEngines
from layerslide.calibrate.host import executor_adamw_block
from layerslide.executor.native import load_kernels

ADAMW_BYTES_PER_PARAM = 28
BLOCK_PARAMS = 100 * 2**20
COPY_BYTES = 256 * 2**20
MODES = ("adamw", "h2d", "d2h", "both", "adamw+h2d", "adamw+d2h", "adamw+both")


def run_mode(mode: str, steps, engines: CopyEngines, copies: int) -> dict:
    up, down = ("h2d" in mode or "both" in mode), ("d2h" in mode or "both" in mode)
    with_adamw = mode.startswith("adamw")
    row: dict = {"mode": mode}
    torch.cuda.synchronize()
    marks = []
    for stream, wanted in zip(engines.streams, (up, down), strict=True):
        if wanted:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record(stream)
    done = engines.start(copies, up=up, down=down) if (up or down) else []
    ends = []
    for stream, wanted in zip(engines.streams, (up, down), strict=True):
        if wanted:
            ends.append(torch.cuda.Event(enable_timing=True))
            ends[-1].record(stream)
    if with_adamw:
        start, finished, i = time.perf_counter(), 0, 0
        last_end = start
        deadline = start + (2.0 if not done else 1e9)
        while True:
            steps[i % len(steps)]()
            i += 1
            now = time.perf_counter()
            if done and any(e.query() for e in done):
                break  # this call ended after a copy direction had: not counted
            finished, last_end = finished + 1, now
            if now >= deadline:
                break
        if finished < 8:
            raise RuntimeError(f"{mode}: only {finished} AdamW calls ran beside the copies: "
                               "raise --seconds")
        row["adamw_gparam_s"] = finished * BLOCK_PARAMS / (last_end - start) / 1e9
        row["adamw_gb_s"] = row["adamw_gparam_s"] * ADAMW_BYTES_PER_PARAM
    torch.cuda.synchronize()
    names = [n for n, w in (("h2d", up), ("d2h", down)) if w]
    for name, first, last in zip(names, marks, ends, strict=True):
        row[f"{name}_gb_s"] = copies * COPY_BYTES / (first.elapsed_time(last) / 1e3) / 1e9
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each mode's copies run")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    native = load_kernels()
    if native is None or not torch.cuda.is_available():
        raise SystemExit("needs the native AdamW and a CUDA GPU")
    steps = [executor_adamw_block(native, BLOCK_PARAMS) for _ in range(4)]
    for step in steps:  # first touch, the kernel's thread pool
        step()
    engines = CopyEngines(COPY_BYTES)
    # copies for ~--seconds at one direction's solo rate
    probe = run_mode("h2d", steps, engines, 8)
    copies = max(8, int(args.seconds * probe["h2d_gb_s"] * 1e9 / COPY_BYTES))
    rows = []
    for r in range(args.rounds):
        for mode in MODES:
            row = run_mode(mode, steps, engines, copies) | {"round": r}
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {}
    for mode in MODES:
        mine = [x for x in rows if x["mode"] == mode]
        summary[mode] = {k: statistics.median(x[k] for x in mine)
                         for k in mine[0] if k.endswith("_s") and k != "mode"}
    report = {"copies_per_mode": copies, "copy_bytes": COPY_BYTES, "block_params": BLOCK_PARAMS,
              "threads": torch.get_num_threads(), "rows": rows, "median": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    alone = summary["adamw"]["adamw_gb_s"]
    print("| mode | AdamW GB/s | AdamW vs alone | H2D GB/s | D2H GB/s | total GB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, got in summary.items():
        a = got.get("adamw_gb_s", 0.0)
        total = a + got.get("h2d_gb_s", 0.0) + got.get("d2h_gb_s", 0.0)
        print(f"| {mode} | {a:.1f} | {a / alone:.2f} | {got.get('h2d_gb_s', 0.0):.1f} | "
              f"{got.get('d2h_gb_s', 0.0):.1f} | {total:.1f} |")


if __name__ == "__main__":
    main()
