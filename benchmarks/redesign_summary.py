"""Summarise a run_redesign_gpu.sh folder: per row and version, each run's median step after
its first two (which carry compilation), and after/before of the versions' means.
usage: python benchmarks/redesign_summary.py FOLDER"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def median_step_s(path: Path) -> float | None:
    logs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steady = [log["step_s"] for log in logs[2:]]
    return statistics.median(steady) if steady else None


def main(folder: Path) -> None:
    rows: dict[str, dict[str, list[float]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        label, version = path.stem.rsplit("_", 1)
        step_s = median_step_s(path)
        print(f"{path.stem}: " + ("too few steps" if step_s is None else f"{step_s:.4f} s/step"))
        if step_s is not None:
            rows.setdefault(label, {}).setdefault(version.rstrip("2"), []).append(step_s)
    for label, sides in rows.items():
        if {"before", "after"} <= set(sides):
            before, after = statistics.mean(sides["before"]), statistics.mean(sides["after"])
            spread = max(max(v) - min(v) for v in sides.values()) / before
            print(f"{label}: before {before:.4f} s, after {after:.4f} s, after/before "
                  f"{after / before:.4f} (runs of one side spread {spread:.1%})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
