"""Ctrl-C during tune, whatif and the purchase question: what was found so far is printed, and
the command exits 130. The interrupt is raised from the search's own calls, in one process."""


from layerslide.cli.main import main
from layerslide.tuner import plans, processes, purchase, search, whatif


def interrupted_after(monkeypatch, module, name: str, calls: int) -> None:
    """module.name raises KeyboardInterrupt once it has been called `calls` times."""
    real, seen = getattr(module, name), []

    def counted(*args, **kwargs):
        seen.append(1)
        if len(seen) > calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)


def test_tune_prints_the_best_so_far_on_ctrl_c(capsys, monkeypatch, tiny_config_folder, tmp_path):
    monkeypatch.setattr(search.os, "cpu_count", lambda: 1)  # one process: the patch holds
    interrupted_after(monkeypatch, plans, "simulate", 2)
    path = tmp_path / "tuned.json"
    code = main(["tune", "--model", tiny_config_folder, "--seq-len", "64", "--profile", "rtx4090-256gb",
                 "--windows", "1,2", "--micro-batches", "1,2,4", "-o", str(path)])
    out, err = capsys.readouterr()
    assert code == 130
    assert "interrupted (Ctrl-C): the best of the " in err
    assert "tune tiny on rtx4090-256gb: " in out and "best plan written to" in out
    assert path.exists()


def test_whatif_prints_the_rows_tuned_so_far_on_ctrl_c(capsys, monkeypatch, tiny_config_folder):
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 1)
    interrupted_after(monkeypatch, whatif, "tune", 1)
    code = main(["whatif", "--model", tiny_config_folder, "--seq-len", "64",
                 "--profiles", "h200-bench,rtx4090-256gb"])
    out, err = capsys.readouterr()
    assert code == 130 and "interrupted (Ctrl-C): the 1 rows tuned so far" in err
    assert "what-if: tiny across profiles (interrupted: the rows tuned so far)" in out
    assert ("h200-bench" in out) != ("rtx4090-256gb" in out)  # one row of the two


def test_the_purchase_question_ranks_the_variants_tuned_so_far_on_ctrl_c(capsys, monkeypatch,
                                                                       tiny_config_folder):
    interrupted_after(monkeypatch, purchase, "tune", 1)
    code = main(["whatif", "--model", tiny_config_folder, "--seq-len", "64", "--target-tokens-per-s", "1",
                 "--platforms", "desktop-ddr5", "--gpus", "rtx4090,rtx5090", "--ram", "128GiB",
                 "--drives", "1", "--workers", "1"])
    out, err = capsys.readouterr()
    assert code == 130 and "interrupted (Ctrl-C): the 1 of 2 variants tuned so far" in err
    assert "(interrupted: 1 of 2 variants tuned)" in out
    assert "desktop-ddr5+rtx4090" in out or "desktop-ddr5+rtx5090" in out
