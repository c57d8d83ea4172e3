import math

import pandas as pd
import pytest

from layerslide.reports import compare_traces, format_table, lane_summary, task_table, write_table


def test_lane_summary_counts_overlap_once(small_trace):
    df = lane_summary(small_trace).set_index("lane")
    assert list(df.index) == ["gpu", "h2d", "d2h"]
    # gpu: [1, 2] u [1.5, 3] = [1, 3] -> 2 s, plus [3.5, 4] -> 2.5 s of 4 s
    assert df.loc["gpu", "busy_s"] == pytest.approx(2.5)
    assert df.loc["gpu", "busy_fraction"] == pytest.approx(2.5 / 4)
    assert df.loc["gpu", "num_tasks"] == 3
    assert df.loc["h2d", "busy_fraction"] == pytest.approx(1.5 / 4)
    assert df.loc["d2h", "busy_fraction"] == pytest.approx(0.5 / 4)


def test_lane_summary_window(small_trace):
    df = lane_summary(small_trace, start_s=1.25, end_s=2.25).set_index("lane")
    assert df.loc["gpu", "busy_fraction"] == pytest.approx(1.0)
    assert df.loc["gpu", "num_tasks"] == 2
    assert df.loc["h2d", "busy_s"] == pytest.approx(0.25)  # load_w1 clipped to [1.25, 1.5]
    assert df.loc["d2h", "busy_s"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="end_s greater"):
        lane_summary(small_trace, start_s=2.0, end_s=2.0)


def test_task_table(small_trace):
    df = task_table(small_trace)
    assert len(df) == 6
    assert list(df["start_s"]) == sorted(df["start_s"])
    assert df.set_index("task_id").loc["fwd1", "duration_s"] == pytest.approx(1.5)


def test_compare_traces(small_trace, measured_trace):
    df = compare_traces(small_trace, measured_trace).set_index("task_id")
    assert set(df.index) == {"load_w0", "fwd0", "load_w1", "fwd1", "off_a0", "head", "extra"}
    assert df.loc["load_w0", "duration_error_s"] == pytest.approx(-0.25)
    assert df.loc["load_w0", "duration_rel_error"] == pytest.approx(-0.2)
    assert df.loc["fwd0", "duration_error_s"] == pytest.approx(0.0)
    assert df.loc["load_w1", "duration_error_s"] == pytest.approx(0.1)
    assert df.loc["fwd1", "duration_rel_error"] == pytest.approx(-0.25)
    assert df.loc["fwd1", "measured_start_s"] == pytest.approx(2.25)
    assert df.loc["off_a0", "duration_error_s"] == pytest.approx(0.5)
    assert math.isnan(df.loc["off_a0", "duration_rel_error"])  # measured duration 0
    assert math.isnan(df.loc["head", "measured_duration_s"])
    assert math.isnan(df.loc["extra", "predicted_duration_s"])
    assert df.loc["extra", "lane"] == "cpu" and df.loc["extra", "kind"] == "optimizer_step"
    assert df["block"].dtype.kind == "i"


def test_compare_traces_rejects_repeated_ids(small_trace):
    twice = type(small_trace)(
        source="measured", label="x", events=small_trace.events + small_trace.events[:1]
    )
    with pytest.raises(ValueError, match="repeated task ids"):
        compare_traces(small_trace, twice)


def test_write_and_format_table(tmp_path):
    df = pd.DataFrame(
        {
            "name": ["a", "b"],
            "tokens_per_s": [22119.37, 1234.5],
            "busy_fraction": [0.123456, 0.5],
            "n": [1, 2],
        }
    )
    csv_path, md_path = write_table(df, tmp_path / "out" / "run.v2")
    assert csv_path.name == "run.v2.csv" and md_path.name == "run.v2.md"
    assert pd.read_csv(csv_path).equals(df)
    md = md_path.read_text()
    assert md.splitlines()[0].startswith("| name")
    assert "22119.4" in md
    text = format_table(df)
    assert "22,119" in text and "0.1235" in text
    assert "22119.37" not in text
