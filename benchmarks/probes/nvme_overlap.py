"""How fast the NVMe tier's reads and writes ran in training, alone and while the other
direction ran, from measured traces (`validate_sim.py --traces`). Run anywhere (no GPU):
    python benchmarks/probes/nvme_overlap.py R/traces/1b-mb8-w2-nvme0.5.measured.json.gz [...]
Steps 0 and 1 are left out (first touches, no steady overlap).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

from layerslide.reports.validation import share_beside
from layerslide.trace import Trace

FULL, NONE = 0.95, 0.05  # a task overlapped over at least / at most this share of its time


def summary(trace: Trace) -> dict:
    steps = sorted({e.step for e in trace.events})
    steady = set(steps[2:])
    lanes = {lane: [e for e in trace.events if e.lane == lane and e.duration_s > 0.01]
             for lane in ("nvme_read", "nvme_write")}
    out = {}
    for lane, other in (("nvme_read", "nvme_write"), ("nvme_write", "nvme_read")):
        mine = [e for e in lanes[lane] if e.step in steady]
        shares = [(share_beside(e, lanes[other]), e.duration_s) for e in mine]
        for name, keep in (("alone", lambda s: s <= NONE), ("beside", lambda s: s >= FULL)):
            times = [d for s, d in shares if keep(s)]
            out[f"{lane} {name}"] = (len(times), statistics.median(times) if times else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path, nargs="+")
    args = ap.parse_args()
    print("| trace | reads alone: n, median ms | reads beside writes | writes alone | "
          "writes beside reads |")
    print("| --- | --- | --- | --- | --- |")
    for path in args.traces:
        with gzip.open(path, "rt") as f:
            got = summary(Trace.from_dict(json.load(f)))
        cells = [f"{n}, {ms * 1e3:.0f}" if ms is not None else f"{n}, -"
                 for n, ms in (got[k] for k in ("nvme_read alone", "nvme_read beside",
                                                "nvme_write alone", "nvme_write beside"))]
        print(f"| {path} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
