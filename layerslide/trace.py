"""Trace: what ran where and when, and memory over time; the one schema that the simulator and
the executor write and the reports read."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

TIERS = ("gpu", "host", "nvme")


@dataclass(frozen=True, kw_only=True)
class TraceEvent:
    """One task's run on one lane, in seconds from the trace's start."""

    task_id: str  # a label (planner.plan.task_id), never parsed
    lane: str  # a kinds.Lane
    kind: str  # a kinds.TaskKind
    block: int  # -1 the embedding, 0..L-1 the decoder layers, L the head
    step: int
    start_s: float
    end_s: float
    # a stream task's enqueue by its lane's host thread (None: a host lane's task, whose run is
    # its host part, or a trace that did not record it): how far the host ran ahead of the GPU
    dispatch_start_s: float | None = None
    dispatch_end_s: float | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def shifted(self, by_s: float) -> TraceEvent:
        """The same event with every time in it moved by by_s seconds."""
        def moved(t: float | None) -> float | None:
            return None if t is None else t + by_s
        return replace(self, start_s=self.start_s + by_s, end_s=self.end_s + by_s,
                       dispatch_start_s=moved(self.dispatch_start_s),
                       dispatch_end_s=moved(self.dispatch_end_s))


@dataclass(frozen=True, kw_only=True)
class MemorySample:
    """Bytes in use on one tier from time_s until the next sample of that tier."""

    time_s: float
    tier: str
    bytes_in_use: int


@dataclass(frozen=True, kw_only=True)
class Trace:
    """Events and memory samples of one run, simulated or measured (see `source`)."""

    source: str  # "simulated" or "measured"
    label: str
    events: tuple[TraceEvent, ...]
    memory: tuple[MemorySample, ...] = ()
    meta: dict = field(default_factory=dict)

    @property
    def lanes(self) -> tuple[str, ...]:
        """Lanes in order of first appearance."""
        return tuple(dict.fromkeys(e.lane for e in self.events))

    @property
    def makespan_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    def peak_bytes(self, tier: str) -> int:
        return max((m.bytes_in_use for m in self.memory if m.tier == tier), default=0)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "label": self.label,
            "meta": self.meta,
            "events": [asdict(e) for e in self.events],
            "memory": [asdict(m) for m in self.memory],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        return cls(
            source=data["source"],
            label=data["label"],
            meta=dict(data.get("meta", {})),
            events=tuple(TraceEvent(**_renamed(e)) for e in data["events"]),
            memory=tuple(MemorySample(**m) for m in data.get("memory", [])),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _renamed(event: dict) -> dict:
    """An event as written before its block was called a block (traces kept in results/)."""
    if "layer" in event:
        event = {**event, "block": event["layer"]}
        del event["layer"]
    return event
