"""whatif --target-tokens-per-s: the purchase table, its files, and bad input refused (exit 2)
before any tuning starts."""

import json

import pandas as pd
import pytest

from layerslide.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_target_search_prints_cheapest_first_and_writes_its_files(capsys, tmp_path, tiny_config_folder):
    out_dir, csv = tmp_path / "buy", tmp_path / "rows.csv"
    code, out, _ = run(capsys, "whatif", "--model", tiny_config_folder, "--seq-len", "64",
                       "--target-tokens-per-s", "1", "--platforms", "desktop-ddr5,workstation-8ch",
                       "--gpus", "rtx4090", "--ram", "128GiB,256GiB", "--drives", "1",
                       "--workers", "1", "--out", str(out_dir), "--csv", str(csv))
    assert code == 0, out
    assert "cheapest that reaches 1 tokens/s: desktop-ddr5+rtx4090,ram=128GiB,drives=1" in out
    assert "not offered (1): desktop-ddr5+rtx4090,ram=256GiB,drives=1 (host ram 256 GiB" in out
    rows = pd.read_csv(csv)
    assert list(rows["profile"]) == ["desktop-ddr5+rtx4090,ram=128GiB,drives=1",
                                     "workstation-8ch+rtx4090,ram=128GiB,drives=1",
                                     "workstation-8ch+rtx4090,ram=256GiB,drives=1"]
    assert list(rows["cost"]) == sorted(rows["cost"])
    data = json.loads((out_dir / "purchase.json").read_text())
    assert data["target_tokens_per_s"] == 1 and len(data["rows"]) == 3
    assert data["skipped"][0]["profile"] == "desktop-ddr5+rtx4090,ram=256GiB,drives=1"
    assert (out_dir / "purchase.png").read_bytes()[:4] == b"\x89PNG"
    assert "cheapest that reaches" in (out_dir / "summary.txt").read_text()
    code, out, _ = run(capsys, "whatif", "--model", tiny_config_folder, "--seq-len", "64",
                       "--target-tokens-per-s", "1", "--platforms", "desktop-ddr5",
                       "--gpus", "rtx5090", "--ram", "128GiB", "--drives", "1", "--json")
    assert code == 0 and json.loads(out)["rows"][0]["card"] == "rtx5090"


@pytest.mark.parametrize("extra, fragment", [
    (["--target-tokens-per-s", "0"], "--target-tokens-per-s 0: give a throughput more than 0"),
    (["--target-tokens-per-s", "-5"], "give a throughput more than 0"),
    (["--target-tokens-per-s", "10", "--platforms", "no-such"], "unknown hardware profile"),
    (["--target-tokens-per-s", "10", "--gpus", "rtx9090"], "unknown GPU card 'rtx9090'"),
    (["--target-tokens-per-s", "10", "--profiles", "h200-bench"],
     "--profiles do not go with --target-tokens-per-s"),
    (["--target-tokens-per-s", "10", "--nvme-drives", "2"], "--nvme-drives do not go with"),
    (["--target-tokens-per-s", "10", "--workers", "0"], "--workers 0: give 1 or more"),
    (["--platforms", "desktop-ddr5"], "--platforms go with --target-tokens-per-s"),
    (["--target-tokens-per-s", "10", "--platforms", "desktop-ddr5", "--ram", "512GiB"],
     "no variant to try"),
])
def test_bad_input_is_refused_before_tuning(capsys, monkeypatch, tiny_config_folder, extra, fragment):
    def never(*args, **kwargs):
        raise AssertionError("tuning started")

    monkeypatch.setattr("layerslide.cli.purchase.purchase_search", never)
    code, out, err = run(capsys, "whatif", "--model", tiny_config_folder, *extra)
    assert code == 2, (out, err)
    assert fragment in err, err


def test_target_needs_a_model_and_a_writable_csv(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("layerslide.cli.purchase.purchase_search",
                        lambda *a, **k: pytest.fail("tuning started"))
    code, _, err = run(capsys, "whatif", "--target-tokens-per-s", "10")
    assert code == 2 and "needs --model M" in err
    code, _, err = run(capsys, "whatif", "--model", "llama-3.2-1b", "--target-tokens-per-s",
                       "10", "--csv", str(tmp_path))
    assert code == 2 and "--csv" in err


def test_any_command_takes_a_variant_profile(capsys):
    code, out, _ = run(capsys, "simulate", "--model", "llama-3.2-1b", "--micro-batch", "1",
                       "--profile", "workstation-8ch+rtx-pro-6000,ram=256GiB,drives=2")
    assert code == 0 and "96.0" in out  # the card's 96 GiB of GPU memory
    code, _, err = run(capsys, "simulate", "--model", "llama-3.2-1b",
                       "--profile", "desktop-ddr5,dimms=4")
    assert code == 2 and "dimms: unknown override" in err
