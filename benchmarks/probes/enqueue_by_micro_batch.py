"""A validation row's decoder-layer backward tasks by their micro-batch and by whether AdamW ran
beside them: task time and host enqueue, median (ms), and the other lanes' tasks that
overlapped most of each enqueue. Reads a validate_sim row and its kept traces; the micro-batch
of each task comes from the row's plan, built again (ids are not parsed).

    python benchmarks/probes/enqueue_by_micro_batch.py VALIDATION_JSON TRACES_DIR LABEL
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.validate_sim import load_gz, row_settings
from layerslide.trace import TraceEvent

MOSTLY = 0.5  # an AdamW task beside a backward for over this share of its time
COMPANY = 0.3  # another lane's task over this share of the enqueue counts as its company


def overlap_s(a: TraceEvent, start_s: float, end_s: float) -> float:
    return max(0.0, min(a.end_s, end_s) - max(a.start_s, start_s))


def micro_batch_of(row: dict, steps: int) -> dict[str, int]:
    """Each task id of the row's plan over `steps` steps -> its micro-batch."""
    from layerslide.planner.build import build_plan

    spec, train, policy = row_settings(row)
    plan = build_plan(spec, train, policy, num_steps=steps)
    return {tid: plan.task(tid).micro_batch for tid in plan.graph}


def table(path: Path, row: dict, steps: tuple[int, ...] = (1, 2)) -> list[str]:
    """A line per (micro-batch, beside AdamW or not) of the trace's layer backward tasks."""
    trace = load_gz(path)
    micro_batch = micro_batch_of(row, max(e.step for e in trace.events) + 1)
    layers = {e.block for e in trace.events if e.kind == "forward" and e.block >= 0}
    adamw = [e for e in trace.events if e.lane == "cpu" and e.kind == "optimizer_step"]
    others = [e for e in trace.events if e.lane != "gpu"]
    groups: dict[tuple[int, bool], list[TraceEvent]] = defaultdict(list)
    for e in trace.events:
        if e.lane != "gpu" or e.kind != "backward" or e.block not in layers \
                or e.step not in steps:
            continue
        beside = sum(overlap_s(c, e.start_s, e.end_s) for c in adamw) / (e.end_s - e.start_s)
        groups[(micro_batch[e.task_id], beside > MOSTLY)].append(e)
    lines = [f"{path.name}: steps {steps}"]
    for (micro_batch, beside), events in sorted(groups.items()):
        took = [(e.end_s - e.start_s) * 1e3 for e in events]
        enqueue = [(e.dispatch_end_s - e.dispatch_start_s) * 1e3 for e in events
                   if e.dispatch_start_s is not None]
        company = Counter(f"{o.lane}:{o.kind}" for e in events if e.dispatch_start_s is not None
                          for o in others
                          if overlap_s(o, e.dispatch_start_s, e.dispatch_end_s)
                          > COMPANY * (e.dispatch_end_s - e.dispatch_start_s))
        lines.append(f"  micro-batch {micro_batch}, beside AdamW {'yes' if beside else 'no '}: "
                     f"{len(events):3d} tasks, took {statistics.median(took):.2f} ms, enqueue "
                     f"{statistics.median(enqueue) if enqueue else float('nan'):.2f} ms; "
                     f"company {dict(company.most_common(4))}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("validation", type=Path, help="validate_sim's validation.json")
    ap.add_argument("traces", type=Path, help="the folder of its rows' kept traces")
    ap.add_argument("label", help="the row")
    args = ap.parse_args()
    rows = {r["label"]: r for r in json.loads(args.validation.read_text())}
    if args.label not in rows:
        ap.error(f"{args.label} is not a row of {args.validation}: {', '.join(rows)}")
    for which in ("measured", "predicted"):
        path = args.traces / f"{args.label}.{which}.json.gz"
        if path.is_file():
            print("\n".join(table(path, rows[args.label])))


if __name__ == "__main__":
    main()
