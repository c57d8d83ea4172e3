"""`layerslide tune --data`: a step's tokens capped at the data's, said; a cap the user gave
stands, with a warning; refusals that say what to give. And train's note where a step takes
more rows than the data has."""

import json
from types import SimpleNamespace

import pytest
from helpers import tiny_model_folder, tiny_text_data

from layerslide.cli.main import main
from layerslide.planner import TrainSpec
from layerslide.training.inputs import _say_passes_a_step

SMALL = ("--windows", "1", "--micro-batches", "1,4,16", "--grad-accums", "1,4",
         "--accumulations", "layer_major", "--casts", "cpu_once", "--activations", "gpu",
         "--seq-len", "16", "--profile", "h200-bench", "--json")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune_data")
    return tiny_model_folder(root / "model"), tiny_text_data(root / "data.jsonl")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_steps_tokens_are_capped_at_the_datas(capsys, folder):
    model, data = folder
    code, out, err = run(capsys, "tune", "--model", str(model), "--data", str(data), *SMALL)
    assert code == 0, err
    said = next(line for line in err.splitlines() if "capped at" in line)
    rows = int(said.split("has ")[1].split(" rows")[0])
    assert 0 < rows < 4 * 16  # the 40 short records fill a few dozen rows of 16
    result = json.loads(out)
    assert result["candidates"]
    assert all(c["tokens_per_step"] <= rows * 16 for c in result["candidates"])


def test_a_cap_the_user_gave_stands_with_a_warning(capsys, folder):
    model, data = folder
    code, out, err = run(capsys, "tune", "--model", str(model), "--data", str(data), *SMALL,
                         "--max-tokens-per-step", "0")
    assert code == 0, err
    assert "passes over the data more than once a step" in err and "capped at" not in err
    assert max(c["tokens_per_step"] for c in json.loads(out)["candidates"]) == 16 * 16 * 4


def test_data_with_a_preset_and_no_tokenizer_is_refused(capsys, folder):
    _, data = folder
    code, _, err = run(capsys, "tune", "--model", "llama-3.2-1b", "--data", str(data), *SMALL)
    assert code == 2 and "--tokenizer DIR" in err and "--max-tokens-per-step" in err


def test_a_tokenizer_without_data_is_refused(capsys, folder):
    model, _ = folder
    code, _, err = run(capsys, "tune", "--model", "llama-3.2-1b", "--tokenizer", str(model),
                       *SMALL)
    assert code == 2 and "give --data FILE too" in err


def test_train_says_when_a_step_takes_more_rows_than_the_data_has(capsys):
    _say_passes_a_step(SimpleNamespace(rows_per_epoch=10), TrainSpec(micro_batch=4,
                                                                      grad_accum=4))
    assert "a step takes 16 rows" in capsys.readouterr().out
    _say_passes_a_step(SimpleNamespace(rows_per_epoch=10), TrainSpec(micro_batch=2,
                                                                      grad_accum=2, gpus=2))
    _say_passes_a_step(SimpleNamespace(), TrainSpec(micro_batch=64))  # synthetic data: no rows
    assert capsys.readouterr().out == ""
