"""calibrate.sharing: the host-memory sharing fitted to AdamW and the copies beside each other."""

from __future__ import annotations

import pytest

from layerslide.calibrate.sharing import fit_host_sharing
from layerslide.simulator.sharing import water_fill

GB = 1e9
# medians of benchmarks/results/archive/sharing_2026-11-30/host_sharing.json (bytes/s)
MEASURED = {
    "adamw": {"adamw": 120.6 * GB},
    "h2d": {"h2d": 54.7 * GB},
    "d2h": {"d2h": 55.3 * GB},
    "adamw+h2d": {"adamw": 104.9 * GB, "h2d": 38.1 * GB},
    "adamw+d2h": {"adamw": 86.1 * GB, "d2h": 55.1 * GB},
    "adamw+both": {"adamw": 73.5 * GB, "h2d": 36.4 * GB, "d2h": 50.5 * GB},
}


def _fit(rates):
    return {m.key: m.value for m in fit_host_sharing(rates)}


def test_the_h200_runs_give_the_builtin_profile():
    got = _fit(MEASURED)
    assert got["shared_capacity_per_adamw"] * 120.6 * GB == pytest.approx(121.1 * GB, rel=0.002)
    assert got["host.dma_read_cost"] == pytest.approx(0.42, abs=0.01)
    assert got["host.dma_write_cost"] == pytest.approx(0.64, abs=0.01)
    assert got["host.dma_share"] == pytest.approx(0.80, abs=0.01)
    assert got["host.dma_write_share"] == pytest.approx(1.40, abs=0.01)


def test_the_fit_reproduces_each_single_direction_run():
    got = _fit(MEASURED)
    for direction, cost, weight in (("h2d", "host.dma_read_cost", "host.dma_share"),
                                    ("d2h", "host.dma_write_cost", "host.dma_write_share")):
        solo = MEASURED[direction][direction]
        adamw, copy = water_fill([120.6 * GB, solo * got[cost]], [1.0, got[weight]],
                                 got["shared_capacity_per_adamw"] * 120.6 * GB)
        beside = MEASURED[f"adamw+{direction}"]
        assert adamw * 120.6 * GB == pytest.approx(beside["adamw"], rel=0.01)
        assert copy * solo == pytest.approx(beside[direction], rel=0.01)


def test_copies_that_do_not_slow_adamw_cost_nothing_and_weigh_one():
    rates = {**MEASURED,
             "adamw+h2d": {"adamw": 120.6 * GB, "h2d": 54.7 * GB},
             "adamw+d2h": {"adamw": 120.6 * GB, "d2h": 55.3 * GB},
             "adamw+both": {"adamw": 120.6 * GB, "h2d": 46.0 * GB, "d2h": 51.0 * GB}}
    got = _fit(rates)
    assert got["shared_capacity_per_adamw"] == pytest.approx(1.0)
    assert got["host.dma_read_cost"] == pytest.approx(0.0, abs=1e-6)
    assert got["host.dma_write_cost"] == pytest.approx(0.0, abs=1e-6)
    assert got["host.dma_share"] == got["host.dma_write_share"] == 1.0


def test_a_negative_cost_from_noise_is_refitted_at_zero():
    # H2D costs nothing here (AdamW beside it keeps its rate); the both-ways run, a little
    # fast, then solves to a negative H2D cost
    rates = {**MEASURED, "adamw+h2d": {"adamw": 120.6 * GB, "h2d": 54.0 * GB},
             "adamw+both": {"adamw": 91.0 * GB, "h2d": 46.0 * GB, "d2h": 50.5 * GB}}
    got = _fit(rates)
    assert got["host.dma_read_cost"] == 0.0
    assert got["host.dma_write_cost"] > 0.3
    assert got["shared_capacity_per_adamw"] >= 1.0


def test_a_missing_run_is_refused():
    rates = {k: v for k, v in MEASURED.items() if k != "adamw+both"}
    with pytest.raises(ValueError, match="adamw\\+both"):
        fit_host_sharing(rates)
