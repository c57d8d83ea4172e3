import math

import pandas as pd
import pytest

from layerslide.reports import plot_memory, plot_timeline, plot_tuning_heatmap, plot_whatif

GIB = 1024**3
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1024


def test_timeline_one_and_two_panels(tmp_path, small_trace, measured_trace):
    assert_png(plot_timeline(small_trace, tmp_path / "one.png"))
    out = plot_timeline([small_trace, measured_trace], tmp_path / "two.png", title="pred vs meas")
    assert out == tmp_path / "two.png"
    assert_png(out)


def test_memory_with_limits(tmp_path, small_trace):
    assert_png(
        plot_memory(
            small_trace, tmp_path / "mem.png", limits_bytes={"gpu": 4 * GIB, "host": 12 * GIB}
        )
    )


def test_heatmap_with_nan_and_infeasible_cells(tmp_path):
    df = pd.DataFrame(
        {
            "window": [1, 1, 2, 2, 2, 3, 3],
            "micro_batch": [1, 8, 1, 8, 8, 1, 8],
            "tokens_per_s": [1000.0, 5000.0, 1500.0, 6000.0, 9999.0, math.nan, 7000.0],
            "feasible": [True, True, True, True, False, False, True],
        }
    )
    assert_png(plot_tuning_heatmap(df, tmp_path / "heat.png"))
    with pytest.raises(ValueError, match="not in"):
        plot_tuning_heatmap(df, tmp_path / "bad.png", value="nope")


def test_whatif_marks_infeasible(tmp_path):
    df = pd.DataFrame(
        {
            "profile": ["h200", "h200", "a100", "laptop"],
            "tokens_per_s": [20000.0, 22000.0, 9000.0, math.nan],
            "feasible": [True, True, True, False],
            "reason": ["", "", "", "host memory 200 GiB over 64 GiB"],
        }
    )
    assert_png(plot_whatif(df, tmp_path / "whatif.png"))
