"""Summarise benchmarks/run_step_logs_gpu.sh's runs: for each (code, round), the median step
time from its JSONL and when its step lines arrived on stdout (the median and longest gap
between consecutive step lines, and the most lines that came within 50 ms of each other: a
burst). Prints a Markdown table.

    python benchmarks/step_log_arrivals.py OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path

BURST_S = 0.05  # lines closer than this arrived together


def arrivals(path: Path) -> list[float]:
    """The arrival time of each step line of a stamped stdout."""
    return [float(line.split()[0]) for line in path.read_text().splitlines()
            if line.split()[1:2] == ["step"]]


def longest_burst(times: list[float]) -> int:
    longest = run = 1
    for a, b in pairwise(times):
        run = run + 1 if b - a < BURST_S else 1
        longest = max(longest, run)
    return longest


def row(out: Path, name: str) -> str:
    records = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
    step_s = statistics.median(r["step_s"] for r in records if "step_s" in r)
    times = arrivals(out / f"{name}.txt")
    gaps = [b - a for a, b in pairwise(times)] or [0.0]
    return (f"| {name} | {len(times)} | {step_s:.4f} | {statistics.median(gaps):.3f} | "
            f"{max(gaps):.3f} | {longest_burst(times) if times else 0} |")


def main(out: Path) -> None:
    print("| run | step lines | median step s (JSONL) | median gap s | longest gap s | "
          "largest burst (lines) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in sorted(out.glob("*.jsonl")):
        print(row(out, path.stem))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
