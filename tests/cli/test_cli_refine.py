"""`layerslide refine`: a profile's CPU AdamW rate set to the one a train run kept."""

import json

import pytest

from layerslide.cli.main import main
from layerslide.hwprofiles import load_profile


def run_folder(tmp_path, predicted=5e9, measured=4e9, profile="h200-bench", **more):
    """A train --out folder as far as refine reads it: its prediction check (after the warm-up
    steps, with the profile's AdamW figure the prediction used)."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "prediction-check.json").write_text(json.dumps({
        "profile": profile, "first_step": 3, "predicted_adamw_alone_params_per_s": predicted,
        "measured_adamw_alone_params_per_s": measured,
        "profile_adamw_params_per_s": load_profile(profile).host.adamw_params_per_s, **more}))
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
    said = refined.sources["host.adamw_throughput"]
    assert said.startswith(base.sources["host.adamw_throughput"])  # what it was measured as
    assert "refined by layerslide refine" in said and "0.800 x the rate predicted on" in said
    printed = capsys.readouterr()
    assert "0.800 x" in printed.out and f"--profile {out}" in printed.out
    assert "warning" not in printed.err  # 0.8: a lease's own drift


def test_refining_again_or_another_profile_sets_the_rate_the_run_kept(tmp_path):
    """The rate is the run's profile's figure times the run's ratio: not compounded."""
    run, out = run_folder(tmp_path), tmp_path / "mine.toml"
    kept = 0.8 * load_profile("h200-bench").host.adamw_params_per_s
    assert main(["refine", "--from-run", str(run), "--out", str(out)]) == 0
    assert main(["refine", "--from-run", str(run), "--out", str(out), "--profile", str(out),
                 "--overwrite"]) == 0
    assert load_profile(str(out)).host.adamw_params_per_s == pytest.approx(kept)
    other = tmp_path / "other.toml"
    assert main(["refine", "--from-run", str(run), "--out", str(other),
                 "--profile", "workstation-8ch"]) == 0
    refined, base = load_profile(str(other)), load_profile("workstation-8ch")
    assert refined.host.adamw_params_per_s == pytest.approx(kept)
    assert refined.host.cores == base.host.cores  # its other figures stay


@pytest.mark.parametrize(("check", "said"), [
    ({"predicted_adamw_alone_params_per_s": None}, "no CPU AdamW rate of the run's decoder"),
    ({"first_step": 2}, "measured its warm-up steps only"),
    # a resumed run's steps are numbered past the warm-up, yet it warmed up in them
    ({"first_step": 8, "past_warmup": False}, "measured its warm-up steps only"),
    ({"measured_adamw_alone_params_per_s": 33e9}, "a run on another machine"),
])
def test_refine_refuses_a_rate_it_cannot_trust(tmp_path, capsys, check, said):
    run = run_folder(tmp_path, **check)
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "a.toml")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "a.toml").exists()


def test_refine_writes_an_implausible_rate_only_when_forced(tmp_path):
    run = run_folder(tmp_path, measured=33e9)
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "a.toml"),
                 "--force"]) == 0
    assert load_profile(str(tmp_path / "a.toml")).host.adamw_params_per_s == pytest.approx(
        6.6 * load_profile("h200-bench").host.adamw_params_per_s)


def test_refine_refuses_what_it_cannot_read_or_write(tmp_path, capsys):
    run, out = run_folder(tmp_path), tmp_path / "mine.toml"
    assert main(["refine", "--from-run", str(run), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["refine", "--from-run", str(run), "--out", str(out)]) == 2  # exists already
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["refine", "--from-run", str(tmp_path), "--out", str(tmp_path / "b.toml")]) == 2
    assert "no prediction-check.json there" in capsys.readouterr().err
    (run / "prediction-check.json").write_text("[1]")
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "c.toml")]) == 2
    assert "no prediction check of `layerslide train`" in capsys.readouterr().err
    assert main(["refine", "--from-run", str(run), "--out", str(tmp_path / "d.txt")]) == 2
    assert "ends in .toml" in capsys.readouterr().err
    # a profile file the run named and refine cannot find from here: name it
    moved = run_folder(tmp_path, profile_adamw_params_per_s=5e9)
    check = json.loads((moved / "prediction-check.json").read_text())
    (moved / "prediction-check.json").write_text(json.dumps({**check, "profile": "gone.toml"}))
    assert main(["refine", "--from-run", str(moved), "--out", str(tmp_path / "e.toml")]) == 2
    assert "name that profile with --profile" in capsys.readouterr().err
    assert main(["refine", "--from-run", str(moved), "--out", str(tmp_path / "e.toml"),
                 "--profile", "h200-bench"]) == 0


def test_a_gpu_run_whose_adamw_kept_another_rate_is_told_how_to_refine():
    from layerslide.cli.run_report import refine_hint
    from layerslide.reports.run_check import check_run

    def check(measured):
        return check_run(profile="h200-bench", predicted_step_s=1.0,
                         predicted_gpu_allocated_bytes=1, predicted_host_bytes=1,
                         step_s=[1.0] * 4, gpu_peak_bytes=[1] * 4, host_peak_bytes=[1] * 4,
                         adamw_alone_params_per_s=(5e9, measured))
    hint = refine_hint(check(4e9), "out", on_gpu=True)
    assert "ran 4.00 Gparam/s where h200-bench gives 5.00" in hint
    assert "layerslide refine --from-run out" in hint
    assert refine_hint(check(4.9e9), "out", on_gpu=True) is None  # within 5%
    assert refine_hint(check(4e9), "out", on_gpu=False) is None  # a CPU run: not the GPU box's


def test_train_records_a_profile_file_so_that_refine_finds_it_from_any_folder(tmp_path,
                                                                              monkeypatch):
    from layerslide.cli.run_report import _where_found

    (tmp_path / "mine.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert _where_found("mine.toml") == str(tmp_path / "mine.toml")
    assert _where_found("h200-bench") == "h200-bench"  # a built-in, by name
