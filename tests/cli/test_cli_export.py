"""`layerslide export`: a checkpoint's model folder from the command line, with the run's
options beside it for a rerun ("same settings, longer") that keeps its checkpoints apart."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import tiny_model_folder, tiny_text_data
from ranks_helpers import Launched, torchrun
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from layerslide.cli.main import main
from layerslide.training.checkpoint_store import CheckpointStore


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-llama"))


def test_export_writes_a_folder_transformers_loads_and_its_options_rerun(model_dir, tmp_path,
                                                                        capsys):
    data, ckpt = tiny_text_data(tmp_path / "data.jsonl"), tmp_path / "ckpt"
    assert main(["train", "--model", str(model_dir), "--data", str(data), "--device", "cpu",
                 "--seq-len", "16", "--micro-batch", "2", "--steps", "2", "--checkpoint-dir",
                 str(ckpt)]) == 0  # no --out: only the checkpoint keeps the trained state
    capsys.readouterr()
    out = tmp_path / "exported"
    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (f"exported step 2 ({ckpt / 'step-000000002'}) to {out}: " in printed
            and f"of bf16 weights, config.json, the tokenizer of {model_dir}, "
                "layerslide-train.toml" in printed)
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0
    assert AutoTokenizer.from_pretrained(out)("the cat")["input_ids"]
    assert main(["export", str(ckpt), "--out", str(out)]) == 2
    assert f"--out {out} exists: pass --overwrite" in capsys.readouterr().err
    # the documented rerun, same settings and longer: its checkpoints go beside the recorded ones
    assert main(["train", "--config", str(out / "layerslide-train.toml"), "--steps", "3",
                 "--out", str(tmp_path / "longer")]) == 0
    err = capsys.readouterr().err
    assert (f"note: --checkpoint-dir {ckpt} (in --config {out / 'layerslide-train.toml'}) "
            "holds the checkpoints of the run that file records: this run writes its own to "
            f"{ckpt}-2") in err
    assert [i.step for i in CheckpointStore(ckpt).list()] == [2]  # the recorded run's, as they were
    assert [i.step for i in CheckpointStore(f"{ckpt}-2").list()] == [3]


def test_export_refuses_what_holds_no_checkpoint(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no complete checkpoint there (a run writes them with --checkpoint-dir)" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path)])  # --out is required


def test_a_checkpoint_of_two_ranks_exports_the_model_they_saved(model_dir, tmp_path, capsys):
    """Each rank's slices, half of them on NVMe, joined into one folder bit for bit; a resume
    of the finished run finds its checkpoint and offers the export once its model is gone."""
    data, ckpt, out = tiny_text_data(tmp_path / "data.jsonl"), tmp_path / "ckpt", tmp_path / "out"
    launched = Launched(torchrun(
        "--standalone", "--nproc-per-node", "2", "-m", "layerslide", "train", "--model",
        str(model_dir), "--data", str(data), "--device", "cpu", "--seq-len", "16",
        "--micro-batch", "2", "--steps", "2", "--checkpoint-dir", str(ckpt), "--out", str(out),
        "--master-on-nvme", "0.5", "--moments-on-nvme", "0.5", "--nvme-dir",
        str(tmp_path / "nvme")))
    status, _, err = launched.finish()
    assert status == 0, err
    exported = tmp_path / "exported"
    assert main(["export", str(ckpt), "--out", str(exported)]) == 0
    assert f"exported step 2 (the slices of 2 ranks in {ckpt}) to {exported}" in \
        capsys.readouterr().out
    saved, joined = load_file(out / "model.safetensors"), load_file(exported / "model.safetensors")
    assert saved.keys() == joined.keys()
    assert all(saved[name].equal(joined[name]) for name in saved)  # bit for bit
    assert json.loads((exported / "config.json").read_text()) == \
        json.loads((out / "config.json").read_text())
    assert main(["train", "--resume", str(ckpt), "--device", "cpu"]) == 2
    assert f"finished all its 2 steps and its model is in {out}" in capsys.readouterr().err
    shutil.rmtree(out)
    assert main(["train", "--resume", str(ckpt), "--device", "cpu"]) == 2
    assert f"write the model with `layerslide export {ckpt} --out {out}`" in \
        capsys.readouterr().err
