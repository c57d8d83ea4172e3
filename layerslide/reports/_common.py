"""Helpers shared by the report modules: lane order, kind colours and event checks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from layerslide.kinds import Lane, TaskKind
from layerslide.trace import Trace

GIB = 1024**3  # reports show memory in GiB (2**30 bytes), never GB

# Lanes and kinds in the order a reader expects them (kinds.py), so that a kind keeps its colour
# across figures and traces; unknown ones follow.
LANE_ORDER = tuple(Lane)
KIND_ORDER = tuple(TaskKind)


def ordered_lanes(lanes: Iterable[str]) -> list[str]:
    """Distinct lanes sorted known-first (LANE_ORDER), then others in order of appearance."""
    seen = list(dict.fromkeys(lanes))
    known = [lane for lane in LANE_ORDER if lane in seen]
    return known + [lane for lane in seen if lane not in LANE_ORDER]


def ordered_kinds(kinds: Iterable[str]) -> list[str]:
    """Distinct kinds sorted known-first (KIND_ORDER), then others alphabetically."""
    seen = set(kinds)
    known = [kind for kind in KIND_ORDER if kind in seen]
    return known + sorted(seen - set(KIND_ORDER))


def as_traces(trace_or_traces: Trace | Sequence[Trace]) -> list[Trace]:
    """One Trace or a sequence of them as a non-empty list."""
    traces = [trace_or_traces] if isinstance(trace_or_traces, Trace) else list(trace_or_traces)
    if not traces:
        raise ValueError("no traces given: pass one Trace or a non-empty sequence of them")
    for trace in traces:
        if not isinstance(trace, Trace):
            raise TypeError(f"expected Trace objects, got {type(trace).__name__}")
    return traces


def check_events(trace: Trace) -> None:
    """Raise ValueError if an event ends before it starts (reports assume non-negative spans)."""
    for event in trace.events:
        if event.end_s < event.start_s:
            raise ValueError(
                f"trace {trace.label!r}: task {event.task_id!r} ends at {event.end_s} s before "
                f"it starts at {event.start_s} s; fix the trace's writer"
            )


def trace_name(trace: Trace) -> str:
    """Display name of a trace: source and label."""
    return f"{trace.source}: {trace.label}" if trace.label else trace.source
