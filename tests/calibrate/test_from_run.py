"""calibrate.from_run: a profile's CPU AdamW moved to what a training run measured."""

import json

import pytest

from layerslide.calibrate.from_run import adamw_from_run, read_check
from layerslide.cli.main import main
from layerslide.hwprofiles import load_profile

LAYER = 200_000_000


def run_check(predicted_s, measured_s, precision="fp32", layer=LAYER, profile="h200-bench"):
    """A prediction check whose layers' AdamW took predicted_s / measured_s alone."""
    return {"profile": profile, "layer_params": layer, "moment_precision": precision,
            "predicted_adamw_alone_params_per_s": layer / predicted_s,
            "measured_adamw_alone_params_per_s": layer / measured_s}


def test_the_part_of_a_call_past_its_fixed_time_scales_the_rate_and_the_memory():
    base = load_profile("h200-bench")
    call = base.host.adamw_call_s
    # predicted 50 ms a layer, measured 40: the variable parts are 50 - c and 40 - c
    found = {m.key: m for m in adamw_from_run(run_check(0.050, 0.040), base)}
    scale = (0.050 - call) / (0.040 - call)
    assert found["host.adamw_throughput"].value == pytest.approx(
        base.host.adamw_params_per_s * scale)
    assert found["host.memory_bandwidth"].value == pytest.approx(
        base.host.memory_bytes_per_s * scale)
    assert "ran 5.00 Gparam/s where h200-bench predicted 4.00" in (
        found["host.adamw_throughput"].how)


def test_compact_moments_move_only_their_own_rate():
    base = load_profile("h200-bench")
    if base.host.adamw_int8_params_per_s is None:
        pytest.skip("h200-bench has no 8-bit AdamW rate")
    found = adamw_from_run(run_check(0.100, 0.110, precision="int8"), base)
    assert [m.key for m in found] == ["host.adamw_int8_throughput"]
    assert found[0].value < base.host.adamw_int8_params_per_s  # the run was slower


def test_a_run_without_the_figures_or_too_small_to_tell_is_refused(tmp_path):
    base = load_profile("h200-bench")
    empty = {"profile": "h200-bench", "predicted_adamw_alone_params_per_s": None,
             "measured_adamw_alone_params_per_s": None}
    with pytest.raises(ValueError, match="no CPU AdamW task with no copy beside it"):
        adamw_from_run(empty, base)
    tiny = run_check(base.host.adamw_call_s / 2, base.host.adamw_call_s / 3, layer=1000)
    with pytest.raises(ValueError, match="too small a model"):
        adamw_from_run(tiny, base)
    with pytest.raises(ValueError, match="no such file"):
        read_check(tmp_path)


def test_calibrate_from_run_writes_the_runs_profile_with_the_measured_adamw(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "prediction-check.json").write_text(json.dumps(run_check(0.050, 0.040)))
    out = tmp_path / "corrected.toml"
    assert main(["calibrate", "--from-run", str(run), "--out", str(out)]) == 0
    assert "with the CPU AdamW this run measured" in capsys.readouterr().out
    base, corrected = load_profile("h200-bench"), load_profile(str(out))
    assert corrected.host.adamw_params_per_s > 1.2 * base.host.adamw_params_per_s
    assert corrected.gpu == base.gpu and corrected.storage == base.storage
    assert "from a training run" in corrected.sources["host.adamw_throughput"]
    # a --base other than the run's: its rates are not the ones the measurement corrects
    assert main(["calibrate", "--from-run", str(run), "--out", str(tmp_path / "x.toml"),
                 "--base", "rtx4090-256gb"]) == 2
    assert "the run was predicted on h200-bench" in capsys.readouterr().err
