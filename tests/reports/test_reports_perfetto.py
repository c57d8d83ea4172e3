import json

import pytest

from layerslide.reports import trace_to_chrome_json, write_chrome_trace
from layerslide.trace import Trace, TraceEvent


def by_ph(doc, ph):
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def test_counts_units_and_tracks(small_trace):
    doc = trace_to_chrome_json(small_trace)
    xs, cs, ms = by_ph(doc, "X"), by_ph(doc, "C"), by_ph(doc, "M")
    assert len(xs) == 6
    assert len(cs) == 5
    # process name + sort index, and thread name + sort index per lane (3 lanes)
    assert len(ms) == 2 + 2 * 3
    threads = {e["args"]["name"]: e["tid"] for e in ms if e["name"] == "thread_name"}
    assert list(threads) == ["gpu", "h2d", "d2h"]  # stable lane order, not first appearance
    assert len(set(threads.values())) == 3
    assert {e["tid"] for e in xs} == set(threads.values())
    for e in xs:
        assert e["tid"] == threads[e["cat"]]
    fwd1 = next(e for e in xs if e["args"]["task_id"] == "fwd1")
    assert fwd1["name"] == "forward"
    assert fwd1["ts"] == pytest.approx(1.5e6)
    assert fwd1["dur"] == pytest.approx(1.5e6)
    assert fwd1["args"] == {"task_id": "fwd1", "block": 1, "step": 0}
    gpu_peak = max(e["args"]["GiB"] for e in cs if e["name"].startswith("gpu"))
    assert gpu_peak == pytest.approx(3.0)
    assert {e["name"] for e in cs} == {"gpu memory (GiB)", "host memory (GiB)"}
    proc = next(e for e in ms if e["name"] == "process_name")
    assert proc["args"]["name"] == "simulated: tiny"


def test_write_several_traces_loads_back(tmp_path, small_trace, measured_trace):
    path = write_chrome_trace([small_trace, measured_trace], tmp_path / "sub" / "t.json")
    doc = json.loads(path.read_text())
    assert len(by_ph(doc, "X")) == 12
    names = {e["pid"]: e["args"]["name"] for e in by_ph(doc, "M") if e["name"] == "process_name"}
    assert names == {1: "simulated: tiny", 2: "measured: tiny"}
    cpu_tracks = [
        e for e in by_ph(doc, "M") if e["name"] == "thread_name" and e["args"]["name"] == "cpu"
    ]
    assert [e["pid"] for e in cpu_tracks] == [2]


def test_single_trace_write_and_bad_event(tmp_path, small_trace):
    path = write_chrome_trace(small_trace, tmp_path / "one.json")
    assert len(by_ph(json.loads(path.read_text()), "X")) == 6
    bad = Trace(
        source="measured",
        label="bad",
        events=(
            TraceEvent(
                task_id="t", lane="gpu", kind="forward", block=0, step=0, start_s=2.0, end_s=1.0
            ),
        ),
    )
    with pytest.raises(ValueError, match="ends at"):
        trace_to_chrome_json(bad)
    with pytest.raises(ValueError):
        write_chrome_trace([], tmp_path / "none.json")
