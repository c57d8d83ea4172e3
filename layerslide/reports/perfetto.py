"""Traces as Chrome Trace Event JSON, which ui.perfetto.dev and chrome://tracing load.

One process per Trace (several traces in one file show predicted and measured side by side),
one thread track per lane, one complete ("X") event per task and one counter ("C") track per
memory tier, in GiB (2**30 bytes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from layerslide.reports._common import GIB, as_traces, check_events, ordered_lanes, trace_name
from layerslide.trace import Trace

_US_PER_S = 1e6  # the format's timestamps and durations are in microseconds


def _process_events(trace: Trace, pid: int) -> list[dict]:
    """Metadata, task and memory events of one trace as process `pid`."""
    check_events(trace)
    out: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "tid": 0,
            "args": {"name": trace_name(trace)},
        },
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": pid},
        },
    ]
    tids = {lane: i + 1 for i, lane in enumerate(ordered_lanes(trace.lanes))}
    for lane, tid in tids.items():
        out.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
        )
        out.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for event in sorted(trace.events, key=lambda e: (e.start_s, tids[e.lane])):
        out.append(
            {
                "ph": "X",
                "name": event.kind,
                "cat": event.lane,
                "pid": pid,
                "tid": tids[event.lane],
                "ts": event.start_s * _US_PER_S,
                "dur": event.duration_s * _US_PER_S,
                "args": {"task_id": event.task_id, "block": event.block, "step": event.step},
            }
        )
    for sample in sorted(trace.memory, key=lambda m: m.time_s):
        out.append(
            {
                "ph": "C",
                "name": f"{sample.tier} memory (GiB)",
                "pid": pid,
                "tid": 0,
                "ts": sample.time_s * _US_PER_S,
                "args": {"GiB": sample.bytes_in_use / GIB},
            }
        )
    return out


def traces_to_chrome_json(traces: Sequence[Trace]) -> dict:
    """Several traces as one Chrome trace document, process i+1 for traces[i]."""
    events: list[dict] = []
    for pid, trace in enumerate(as_traces(traces), start=1):
        events.extend(_process_events(trace, pid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def trace_to_chrome_json(trace: Trace) -> dict:
    """One trace as a Chrome trace document (a JSON-ready dict); does not write anything."""
    return traces_to_chrome_json([trace])


def write_chrome_trace(trace_or_traces: Trace | Sequence[Trace], path: str | Path) -> Path:
    """Write one or several traces to `path` as Chrome trace JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(traces_to_chrome_json(as_traces(trace_or_traces))))
    return path
