"""How late the d2h lane enqueues a layer's grad offload, measured against predicted: the host
thread's delay after the layer's backward is enqueued, the enqueue's own time, and how often the
offload is still not enqueued when the next layer's backward begins its enqueue, and (measured)
how often long and short enqueues ran beside another lane thread's. Until then the
layer's bf16 grads count in torch's allocated bytes beside the next backward's workspace: why
Mistral-7B mb8's allocated peak is predicted 11-13% low
(benchmarks/results/archive/scoreboard_2026-12-04c).

usage: python benchmarks/probes/offload_enqueue.py TRACES LABEL [LABEL ...]
  TRACES: a folder with LABEL.measured.json.gz and LABEL.predicted.json.gz (a validation call's
  traces.tar.gz, unpacked). Reads the last step of each trace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.validate_sim import load_gz
from layerslide.trace import Trace


def offload_lags(trace: Trace) -> dict[str, list[float]]:
    """Per decoder layer of the trace's last step (seconds): the offload's enqueue start after
    its backward's enqueue end, its enqueue's duration, and its enqueue end after the next
    layer's backward enqueue start (> 0: the grads were still held then)."""
    last = max(e.step for e in trace.events)
    by_key = {(e.kind, e.block): e for e in trace.events
              if e.step == last and e.dispatch_start_s is not None}
    lags: dict[str, list[float]] = {"start_after_backward": [], "enqueue": [],
                                    "end_after_next_backward": [], "done_after_backward": [],
                                    "next_backward_after": [],
                                    "backward_enqueue": []}
    for (kind, block), backward in by_key.items():
        offload = by_key.get(("offload_grads", block))
        following = by_key.get(("backward", block - 1))
        if kind != "backward" or block < 0 or offload is None or following is None:
            continue
        lags["start_after_backward"].append(offload.dispatch_start_s - backward.dispatch_end_s)
        lags["enqueue"].append(offload.dispatch_end_s - offload.dispatch_start_s)
        lags["end_after_next_backward"].append(offload.dispatch_end_s
                                               - following.dispatch_start_s)
        lags["done_after_backward"].append(offload.dispatch_end_s - backward.dispatch_end_s)
        lags["next_backward_after"].append(following.dispatch_start_s - backward.dispatch_end_s)
        lags["backward_enqueue"].append(backward.dispatch_end_s - backward.dispatch_start_s)
    return lags


def summary_line(name: str, lags: dict[str, list[float]]) -> str:
    if not lags["enqueue"]:
        return f"{name}: no layer with a backward and a grad offload enqueued"

    def ms(values: list[float]) -> str:
        ordered = sorted(values)
        p10, p90 = (ordered[int(q * (len(values) - 1))] for q in (0.1, 0.9))
        return (f"{statistics.median(values) * 1e3:.2f} ms (p10 {p10 * 1e3:.2f}, "
                f"p90 {p90 * 1e3:.2f})")
    late = lags["end_after_next_backward"]
    return (f"{name}: offload enqueue starts {ms(lags['start_after_backward'])} after its "
            f"backward's enqueue, takes {ms(lags['enqueue'])}, is done "
            f"{ms(lags['done_after_backward'])} after it; still not enqueued as the next "
            f"backward's enqueue begins in {sum(x > 0 for x in late)} of {len(late)} layers; "
            f"the next backward's enqueue begins {ms(lags['next_backward_after'])} after, a "
            f"backward's enqueue takes {ms(lags['backward_enqueue'])}")


LONG_ENQUEUE_S = 3e-3


def beside_other_enqueues(trace: Trace) -> str:
    """From step 1 on: how many long (> LONG_ENQUEUE_S) and short grad-offload enqueues ran
    while the h2d or gpu lane's thread was enqueueing too (threads that share the GIL)."""
    events = [e for e in trace.events if e.step >= 1 and e.dispatch_start_s is not None]
    offloads = [e for e in events if e.kind == "offload_grads"]

    def beside(e, lane: str) -> bool:
        return any(x.lane == lane and x.dispatch_start_s < e.dispatch_end_s
                   and x.dispatch_end_s > e.dispatch_start_s for x in events)
    parts = []
    for name, group in (("long", [e for e in offloads if e.dispatch_end_s - e.dispatch_start_s
                                  > LONG_ENQUEUE_S]),
                        ("short", [e for e in offloads if e.dispatch_end_s - e.dispatch_start_s
                                   <= LONG_ENQUEUE_S])):
        parts.append(f"{name} {len(group)}: beside an h2d enqueue "
                     f"{sum(beside(e, 'h2d') for e in group)}, beside a gpu enqueue "
                     f"{sum(beside(e, 'gpu') for e in group)}")
    return f"offload enqueues (> {LONG_ENQUEUE_S * 1e3:.0f} ms long): " + "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path)
    ap.add_argument("labels", nargs="+")
    args = ap.parse_args()
    for label in args.labels:
        for kind in ("measured", "predicted"):
            trace = load_gz(args.traces / f"{label}.{kind}.json.gz")
            print(summary_line(f"{label} {kind}", offload_lags(trace)))
            if kind == "measured":
                print(f"  {beside_other_enqueues(trace)}")


if __name__ == "__main__":
    main()
