"""Where a measured (or simulated) run's GPU lane spends its steps: per step after the first
`--skip`, the GPU lane's busy seconds by task kind and its idle seconds (gaps between tasks),
averaged over those steps. Reads layerslide trace JSON (plain or gzipped).

usage: python benchmarks/probes/trace_gpu_kinds.py TRACE [TRACE ...] [--skip 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

from layerslide.trace import Trace


def load(path: Path) -> Trace:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return Trace.from_dict(json.load(f))


def gpu_by_kind(trace: Trace, skip: int) -> dict[str, float]:
    """Mean seconds per step on the GPU lane by kind, plus "idle" and "step"."""
    events = sorted((e for e in trace.events if e.lane == "gpu"), key=lambda e: e.start_s)
    steps = sorted({e.step for e in events})[skip:]
    if not steps:
        raise SystemExit(f"{trace.label}: no steps after the first {skip}")
    totals: dict[str, float] = defaultdict(float)
    for step in steps:
        mine = [e for e in events if e.step == step]
        for e in mine:
            totals[e.kind] += e.duration_s
        busy_end = mine[0].start_s
        for e in mine:  # gaps: time the lane had nothing running
            totals["idle"] += max(0.0, e.start_s - busy_end)
            busy_end = max(busy_end, e.end_s)
        totals["step"] += busy_end - mine[0].start_s
    return {k: v / len(steps) for k, v in totals.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--skip", type=int, default=2)
    args = ap.parse_args()
    for path in args.traces:
        trace = load(path)
        kinds = gpu_by_kind(trace, args.skip)
        parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"{path.name} ({trace.source}): s per step: {parts}")


if __name__ == "__main__":
    main()
