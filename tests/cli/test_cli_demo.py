"""demo: the README's run command writes a complete report folder."""

from layerslide.cli.main import main


def test_demo_writes_report_folder(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path.resolve()) in out
    for name in ("README.md", "timeline_default.png", "timeline_tuned.png", "memory_tuned.png",
                 "tuning_heatmap.png", "whatif_profiles.png", "tuning.csv", "tuning.md",
                 "trace_tuned.json", "plan_tuned.json", "predictions.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    readme = (tmp_path / "README.md").read_text()
    assert "tokens/s" in readme and "Simulated, not measured" in readme
