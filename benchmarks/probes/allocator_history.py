"""Where the caching allocator's reserve grows beyond what is allocated, from a history that
`validate_sim.py --allocator-history` recorded (torch.cuda.memory._snapshot, gzip'ed pickle).

Per stream: the peak of allocated bytes, the reserve at the end, and each growth of the reserve
(a new segment, or pages mapped onto an expandable one) with the step it happened in, the
request that caused it and what that stream had allocated then. Run anywhere (no GPU):
    python benchmarks/probes/allocator_history.py R/traces/3b-mb8-w2-host.allocator.pickle.gz
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import pickle
from collections import defaultdict
from itertools import accumulate
from pathlib import Path

GIB = 2**30
GROWS = ("segment_alloc", "segment_map")
SHRINKS = ("segment_free", "segment_unmap")


def load(path: Path) -> dict:
    with gzip.open(path, "rb") as f:
        return pickle.load(f)


def step_of(time_us: float, fit_start_s: float, step_ends_s: list[float]) -> int:
    """The step a moment falls in: -1 before training, len(step_ends_s) after it. step_ends_s
    are seconds after fit_start_s at which each step's host part had run."""
    seconds = time_us / 1e6 - fit_start_s
    return -1 if seconds < 0 else bisect.bisect_left(step_ends_s, seconds)


def analyse(snapshot: dict) -> dict:
    """Per stream: allocated peak, reserve growth events, reserve at the end of the history."""
    meta = snapshot.get("layerslide", {})
    fit_start_s = meta.get("fit_wall_s", (0.0, 0.0))[0]
    if meta.get("step_end_wall_s"):  # recorded as each step ran
        step_ends_s = [t - fit_start_s for t in meta["step_end_wall_s"]]
    else:  # older histories: step times added up from the start, each boundary a little early
        step_ends_s = list(accumulate(meta.get("step_s", [])))
    events = [e for trace in snapshot["device_traces"] for e in trace]
    allocated: dict[int, int] = defaultdict(int)
    peak: dict[int, int] = defaultdict(int)
    reserved: dict[int, int] = defaultdict(int)  # growth since the history began
    growth: dict[int, list] = defaultdict(list)
    last_request: dict[int, int] = {}
    for e in events:
        stream, size, action = e["stream"], e["size"], e["action"]
        if action == "alloc":
            allocated[stream] += size
            peak[stream] = max(peak[stream], allocated[stream])
            last_request[stream] = size
        elif action == "free_completed":
            allocated[stream] -= size
        elif action in GROWS:
            reserved[stream] += size
            growth[stream].append({
                "step": step_of(e["time_us"], fit_start_s, step_ends_s), "bytes": size,
                "allocated_then": allocated[stream], "reserved_then": reserved[stream]})
        elif action in SHRINKS:
            reserved[stream] -= size
        elif action == "oom":
            growth[stream].append({"step": step_of(e["time_us"], fit_start_s, step_ends_s),
                                   "oom": size})
    at_end = defaultdict(int)
    for segment in snapshot["segments"]:
        at_end[segment["stream"]] += segment["total_size"]
    return {stream: {"allocated_peak_in_history": peak[stream], "reserved_at_end": at_end[stream],
                     "grown_in_history": reserved[stream], "growth": growth[stream]}
            for stream in sorted(set(at_end) | set(peak))}


def report(name: str, result: dict) -> str:
    header = ("| stream | allocated peak | reserved at end | growths in the history "
              "(step: +GiB at allocated GiB) |")
    lines = [f"## {name}", "", header, "| --- | --- | --- | --- |"]
    for stream, r in result.items():
        by_step: dict[int, list] = defaultdict(list)
        for g in r["growth"]:
            by_step[g["step"]].append(g)
        growths = "; ".join(
            f"step {step}: {len(gs)} x, +{sum(g.get('bytes', 0) for g in gs) / GIB:.2f} "
            f"(last at {gs[-1].get('allocated_then', 0) / GIB:.2f})"
            for step, gs in sorted(by_step.items()))
        lines.append(f"| {stream:#x} | {r['allocated_peak_in_history'] / GIB:.2f} | "
                     f"{r['reserved_at_end'] / GIB:.2f} | {growths or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("histories", type=Path, nargs="+")
    args = ap.parse_args()
    for path in args.histories:
        print(report(path.name.split(".allocator")[0], analyse(load(path))))


if __name__ == "__main__":
    main()
