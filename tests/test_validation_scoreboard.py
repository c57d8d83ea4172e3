"""benchmarks/validation_scoreboard.py: committed rows predicted again on their own call's
profile, labelled by call, superseded rows left out, missing folders refused by name."""

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import validation_scoreboard as scoreboard

CALL = "validation_2026-12-04b/call1"  # two rows: Qwen3-4B layer-major, Mistral-7B mb8


def test_a_calls_rows_are_predicted_again_on_its_profile_and_labelled_by_it():
    committed = json.loads((scoreboard.RESULTS / CALL / "validation.json").read_text())
    rows = scoreboard.call_rows(CALL)
    assert [r["label"] for r in rows] == [f"12-04b/call1:{r['label']}" for r in committed]
    for row, before in zip(rows, committed, strict=True):
        assert row["measured_step_s"] == before["measured_step_s"]  # the measurement stays
        assert row["predicted_step_s"] > 0 and row["predicted_regime"] in ("GPU", "CPU", "disk")
        assert row["group"].startswith("12-04b/call1:") and row["call"] == CALL


def test_superseded_rows_are_left_out(tmp_path, monkeypatch):
    shutil.copytree(scoreboard.RESULTS / CALL, tmp_path / "call")
    monkeypatch.setitem(scoreboard.SUPERSEDED, ("call", "mistral7b-mb8-w2-host"), "a test")
    rows = scoreboard.call_rows("call", results=tmp_path)
    assert [r["label"] for r in rows] == ["call:qwen4b-mb4x4-w2-host-lm"]


def test_rows_whose_gpu_reserve_is_superseded_keep_their_step_time_and_allocated_peak(
        tmp_path, monkeypatch):
    shutil.copytree(scoreboard.RESULTS / CALL, tmp_path / "call")
    monkeypatch.setitem(scoreboard.GPU_RESERVE_SUPERSEDED, ("call", "mistral7b-mb8-w2-host"),
                        "a test")
    rows = {r["label"]: r for r in scoreboard.call_rows("call", results=tmp_path)}
    mistral, qwen = rows["call:mistral7b-mb8-w2-host"], rows["call:qwen4b-mb4x4-w2-host-lm"]
    assert mistral["measured_step_s"] > 0 and mistral["measured_gpu_allocated_bytes"] > 0
    assert mistral["measured_gpu_reserved_bytes"] is None and mistral["gpu_memory_detail"] is None
    assert qwen["measured_gpu_reserved_bytes"] > 0 and qwen["gpu_memory_detail"]


def test_a_folder_without_its_profile_is_refused_by_name(tmp_path):
    (tmp_path / "call").mkdir()
    with pytest.raises(SystemExit, match="h200-calibrated.toml not there"):
        scoreboard.call_rows("call", results=tmp_path)


def test_what_ifs_scale_or_set_a_profile_field_and_refuse_what_is_no_number_field():
    from layerslide.hwprofiles import load_profile

    profile = load_profile("h200-bench")
    adjust = scoreboard.adjusted({"gpu.kernel_launch_s": 2.0},
                                 {"host.kernel_launch_beside_kernels_s": 19e-6})
    changed = adjust(profile)
    assert changed.gpu.kernel_launch_s == pytest.approx(2 * profile.gpu.kernel_launch_s)
    assert changed.host.kernel_launch_beside_kernels_s == 19e-6
    assert changed.host.adamw_params_per_s == profile.host.adamw_params_per_s
    assert scoreboard.profile_field_and_number("host.kernel_launch_beside_kernels_s=2e-5") == (
        "host.kernel_launch_beside_kernels_s", 2e-5)
    for bad in ("gpu.kernel_launch=2", "gpu.name=2", "gpu.kernel_launch_s=0",
                "gpu.kernel_launch_s=fast", "gpu.kernel_launch_s=inf", "nothing.at_all=1",
                "host.ram_max_bytes=1e12", "host.cores=8"):
        with pytest.raises(argparse.ArgumentTypeError):
            scoreboard.profile_field_and_number(bad)
    unmeasured = load_profile("rtx4090-256gb")
    assert unmeasured.host.kernel_launch_beside_kernels_s is None
    with pytest.raises(SystemExit, match="--set it"):  # nothing there to scale
        scoreboard.adjusted({"host.kernel_launch_beside_kernels_s": 2.0}, {})(unmeasured)


def test_a_call_calibrated_at_nice_19_names_its_launch_price_the_niced_one():
    from layerslide.hwprofiles import load_profile

    call = "validation_2026-12-04c/call3"
    assert call in scoreboard.NICED_CALIBRATIONS
    given = load_profile(str(scoreboard.RESULTS / call / scoreboard.PROFILE))
    named = scoreboard.niced_price_named(given)
    assert named.host.kernel_launch_beside_niced_kernels_s == \
        given.host.kernel_launch_beside_kernels_s
    assert named.host.kernel_launch_beside_kernels_s is None
    rows = {r["label"]: r for r in scoreboard.call_rows(call)}
    committed = {r["label"]: r for r in json.loads(
        (scoreboard.RESULTS / call / "validation.json").read_text())}
    # the nice-19 rows are priced as the call priced them, beside niced workers; those run at
    # nice 0 have no price of their own and are left out
    assert set(rows) == {f"12-04c/call3:{label}" for label in committed if "nice19" in label}
    label = "qwen4b-mb4x4-w2-host-lm-nice19"
    assert rows[f"12-04c/call3:{label}"]["predicted_step_s"] == pytest.approx(
        committed[label]["predicted_step_s"], rel=1e-6)
    # a what-if scales the price as measured, then it is named
    scaled = {r["label"]: r for r in scoreboard.call_rows(call, adjust=scoreboard.adjusted(
        {"host.kernel_launch_beside_kernels_s": 2.0}, {}))}
    assert scaled[f"12-04c/call3:{label}"]["predicted_step_s"] > \
        rows[f"12-04c/call3:{label}"]["predicted_step_s"] * 1.05  # dispatch-bound: slower
