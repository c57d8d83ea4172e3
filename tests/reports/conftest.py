"""Small hand-built traces shared by the report tests."""

import pytest

from layerslide.trace import MemorySample, Trace, TraceEvent

GIB = 1024**3


def ev(task_id, lane, kind, start_s, end_s, layer=0, step=0):
    return TraceEvent(
        task_id=task_id, lane=lane, kind=kind, block=layer, step=step, start_s=start_s, end_s=end_s
    )


@pytest.fixture
def small_trace() -> Trace:
    """3 lanes, 6 events (two overlap on gpu), 5 memory samples on 2 tiers; makespan 4 s."""
    events = (
        ev("load_w0", "h2d", "load_weights", 0.0, 1.0, layer=0),
        ev("fwd0", "gpu", "forward", 1.0, 2.0, layer=0),
        ev("load_w1", "h2d", "load_weights", 1.0, 1.5, layer=1),
        ev("fwd1", "gpu", "forward", 1.5, 3.0, layer=1),  # overlaps fwd0 on gpu for 0.5 s
        ev("off_a0", "d2h", "offload_activation", 2.0, 2.5, layer=0),
        ev("head", "gpu", "head", 3.5, 4.0, layer=2),
    )
    memory = (
        MemorySample(time_s=0.0, tier="gpu", bytes_in_use=1 * GIB),
        MemorySample(time_s=1.0, tier="gpu", bytes_in_use=3 * GIB),
        MemorySample(time_s=3.0, tier="gpu", bytes_in_use=2 * GIB),
        MemorySample(time_s=0.0, tier="host", bytes_in_use=10 * GIB),
        MemorySample(time_s=2.0, tier="host", bytes_in_use=11 * GIB),
    )
    return Trace(source="simulated", label="tiny", events=events, memory=memory)


@pytest.fixture
def measured_trace(small_trace) -> Trace:
    """The small trace 'measured': durations changed, one task missing, one extra task."""
    events = (
        ev("load_w0", "h2d", "load_weights", 0.0, 1.25, layer=0),  # 1.25 vs 1.0 predicted
        ev("fwd0", "gpu", "forward", 1.25, 2.25, layer=0),  # 1.0 vs 1.0
        ev("load_w1", "h2d", "load_weights", 1.25, 1.65, layer=1),  # 0.4 vs 0.5
        ev("fwd1", "gpu", "forward", 2.25, 4.25, layer=1),  # 2.0 vs 1.5
        ev("off_a0", "d2h", "offload_activation", 2.25, 2.25, layer=0),  # 0 vs 0.5
        ev("extra", "cpu", "optimizer_step", 4.0, 5.0, layer=0),
    )
    return Trace(source="measured", label="tiny", events=events)
