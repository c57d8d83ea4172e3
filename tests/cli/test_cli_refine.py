"""`layerslide refine`: a profile's CPU AdamW rate set to the one a train run kept."""

import json

import pytest

from layerslide.cli.main import main
from layerslide.hwprofiles import load_profile


def run_folder(tmp_path, predicted=5e9, measured=4e9, profile="h200-bench"):
    """A train --out folder as far as refine reads it: its prediction check."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "prediction-check.json").write_text(json.dumps({
        "profile": profile, "predicted_adamw_alone_params_per_s": predicted,
        "measured_adamw_alone_params_per_s": measured}))
    return folder


def test_refine_scales_the_profiles_adamw_by_what_the_run_kept(tmp_path, capsys):
    out = tmp_path / "mine.toml"
    assert main(["refine", "--from-run", str(run_folder(tmp_path)), "--out", str(out)]) == 0
    base, refined = load_profile("h200-bench"), load_profile(str(out))
    assert refined.name == "mine"
    assert refined.host.adamw_params_per_s == pytest.approx(0.8 * base.host.adamw_params_per_s)
    # the host memory's capacity is kept as a ratio to AdamW's rate, and the compact moments'
    # kernel is the same memory-bound one
    assert refined.host.memory_bytes_per_s == pytest.approx(0.8 * base.host.memory_bytes_per_s)
    assert refined.host.adamw_bf16_params_per_s == pytest.approx(
        0.8 * base.host.adamw_bf16_params_per_s)
    assert refined.host.cast_bytes_per_s == base.host.cast_bytes_per_s and refined.gpu == base.gpu
    assert "refined from" in refined.sources["host.adamw_throughput"]
    assert "0.800 x the rate predicted on h200-bench" in refined.sources["host.adamw_throughput"]
    printed = capsys.readouterr()
    assert "0.800 x" in printed.out and f"--profile {out}" in printed.out
    assert "warning" not in printed.err  # 0.8: a lease's own drift


def test_refine_takes_another_profile_and_refuses_what_it_cannot_use(tmp_path, capsys):
    run = run_folder(tmp_path, predicted=4e9, measured=5e9)
    out = tmp_path / "mine.toml"
    assert main(["refine", "--from-run", str(run), "--out", str(out),
                 "--profile", "workstation-8ch"]) == 0
    assert load_profile(str(out)).host.adamw_params_per_s == pytest.approx(
        1.25 * load_profile("workstation-8ch").host.adamw_params_per_s)
    capsys.readouterr()
    assert main(["refine", "--from-run", str(run), "--out", str(out)]) == 2  # exists already
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["refine", "--from-run", str(tmp_path), "--out", str(tmp_path / "b.toml")]) == 2
    assert "no prediction-check.json there" in capsys.readouterr().err
    (run / "prediction-check.json").write_text(json.dumps(
        {"profile": "h200-bench", "predicted_adamw_alone_params_per_s": None,
         "measured_adamw_alone_params_per_s": None}))
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "c.toml")]) == 2
    assert "no CPU AdamW rate of the run's decoder layers alone" in capsys.readouterr().err
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "d.txt")]) == 2
    assert "ends in .toml" in capsys.readouterr().err
