"""plot_purchase: tokens/s against cost per machine variant (or against RAM without prices)."""

import pandas as pd
import pytest

from layerslide.reports import plot_purchase

GIB = 1024**3


def _frame(costs):
    return pd.DataFrame({
        "profile": ["a+rtx4090", "a+rtx5090", "b+rtx5090", "b+rtx-pro-6000"],
        "platform": ["a", "a", "b", "b"], "card": ["rtx4090", "rtx5090", "rtx5090", "rtx-pro-6000"],
        "ram_bytes": [128 * GIB, 128 * GIB, 512 * GIB, 512 * GIB], "drives": [1, 2, 4, 1],
        "cost": costs, "currency": ["USD"] * 4, "tokens_per_s": [150.0, 290.0, None, 600.0]})


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024


def test_purchase_figure_against_cost_with_a_target(tmp_path):
    out = plot_purchase(_frame([4500, 4900, 12500, 18000]), tmp_path / "p.png", target=250)
    assert out == tmp_path / "p.png"
    _png(out)


def test_purchase_figure_without_prices_plots_against_ram(tmp_path):
    _png(plot_purchase(_frame([None] * 4), tmp_path / "ram.png", target=1000, title="no prices"))


def test_purchase_figure_names_missing_columns(tmp_path):
    with pytest.raises(ValueError, match="card"):
        plot_purchase(pd.DataFrame({"tokens_per_s": [1.0], "platform": ["a"],
                                    "ram_bytes": [1]}), tmp_path / "x.png")
