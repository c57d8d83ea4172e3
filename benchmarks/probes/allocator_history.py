"""Where the caching allocator's reserve grows beyond what is allocated, from a history that
`validate_sim.py --allocator-history` recorded (torch.cuda.memory._snapshot, gzip'ed pickle).

Per stream: the peak of allocated bytes, the reserve at the end, and each growth of the reserve
(a new segment, or pages mapped onto an expandable one) with the step it happened in, the
request that caused it and what that stream had allocated then. Run anywhere (no GPU):
    python benchmarks/probes/allocator_history.py R/traces/3b-mb8-w2-host.allocator.pickle.gz

--at-peak STEP: instead, the blocks alive at the history's largest allocated total from step
STEP on, as torch's allocated counter holds them (from the request until the host frees the
tensor, record_stream or not), each with its size, stream and age.
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


def live_at_peak(snapshot: dict, from_step: int) -> dict:
    """The blocks alive at the largest allocated total (every stream, from the history's start)
    reached from step `from_step` on: torch's allocated counter, a block counted from its
    request (alloc) to its host's free (free_requested)."""
    meta = snapshot.get("layerslide", {})
    fit_start_s = meta.get("fit_wall_s", (0.0, 0.0))[0]
    step_ends_s = [t - fit_start_s for t in meta.get("step_end_wall_s", [])]
    events = sorted((e for trace in snapshot["device_traces"] for e in trace),
                    key=lambda e: e["time_us"])
    live: dict[int, dict] = {}
    total = peak = 0
    at_peak: dict = {"total": 0, "time_us": None, "blocks": []}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if (total > peak and step_ends_s
                    and step_of(e["time_us"], fit_start_s, step_ends_s) >= from_step):
                peak = total
                at_peak = {"total": total, "time_us": e["time_us"], "blocks": list(live.values())}
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    if at_peak["time_us"] is not None:
        at_peak["step"] = step_of(at_peak["time_us"], fit_start_s, step_ends_s)
    return at_peak


def peak_report(name: str, at_peak: dict, *, min_bytes: int = 2**20) -> str:
    if at_peak["time_us"] is None:
        return f"## {name}\n\nno step boundaries recorded: no peak to place\n"
    heading = (f"allocated {at_peak['total'] / GIB:.3f} GiB in the history (blocks requested "
               f"before it began are not in it), in step {at_peak['step']}; blocks of "
               f"{min_bytes / 2**20:g} MiB and more, largest first:")
    lines = [f"## {name}", "", heading, "",
             "| MiB | requested ms before | stream |", "| --- | --- | --- |"]
    small = 0
    for block in sorted(at_peak["blocks"], key=lambda b: (-b["size"], b["time_us"])):
        if block["size"] < min_bytes:
            small += block["size"]
            continue
        age_ms = (at_peak["time_us"] - block["time_us"]) / 1e3
        lines.append(f"| {block['size'] / 2**20:.1f} | {age_ms:.2f} | {block['stream']:#x} |")
    lines.append(f"\nsmaller blocks: {small / 2**20:.1f} MiB together")
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--at-peak", type=int, metavar="STEP", default=None,
                    help="list the blocks alive at the allocated peak from this step on")
    args = ap.parse_args()
    for path in args.histories:
        name = path.name.split(".allocator")[0]
        if args.at_peak is None:
            print(report(name, analyse(load(path))))
        else:
            print(peak_report(name, live_at_peak(load(path), args.at_peak)))


if __name__ == "__main__":
    main()
