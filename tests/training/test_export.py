"""export_checkpoint: a checkpoint's model is the model the run saves, bit for bit in bf16,
wherever its state lay (RAM, NVMe, GPU-updated blocks), with the run's config and tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import tiny_model_folder, tiny_text_data
from safetensors.torch import load_file

from layerslide.cli.main import main
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.export import export_checkpoint
from layerslide.training.run import RunError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def data_file(tmp_path):
    return tiny_text_data(tmp_path / "data.jsonl")


def train(model_dir, data_file, tmp_path, *extra: str) -> list[str]:
    return ["train", "--model", str(model_dir), "--data", str(data_file), "--device", "cpu",
            "--seq-len", "16", "--micro-batch", "2", "--lr", "1e-3", "--steps", "3",
            "--checkpoint-dir", str(tmp_path / "ckpt"), *extra]


def weights(folder) -> dict:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("placement", [
    [], ["--master-on-nvme", "0.5", "--moments-on-nvme", "0.5"], ["--gpu-updated-blocks", "1"]])
def test_the_exported_model_is_the_one_the_run_saved(model_dir, data_file, tmp_path,
                                                     placement):
    nvme = ["--nvme-dir", str(tmp_path / "nvme")] if placement[:1] == ["--master-on-nvme"] else []
    out = tmp_path / "tuned"
    assert main(train(model_dir, data_file, tmp_path, "--out", str(out), *placement,
                      *nvme)) == 0
    done = export_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "exported"))
    assert done.step == 3 and done.tokenizer == model_dir
    saved, exported = weights(out), weights(done.folder)
    assert saved.keys() == exported.keys()
    assert all(saved[name].equal(exported[name]) for name in saved)  # bit for bit
    assert json.loads((done.folder / "config.json").read_text()) == \
        json.loads((out / "config.json").read_text())
    assert (done.folder / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_a_step_and_a_damaged_newest_choose_the_checkpoint(model_dir, data_file,
                                                         tmp_path, capsys):
    assert main(train(model_dir, data_file, tmp_path, "--checkpoint-every", "1",
                      "--keep-checkpoints", "3")) == 0
    ckpt = tmp_path / "ckpt"
    second = export_checkpoint(str(ckpt), str(tmp_path / "second"), step=2)
    assert second.step == 2
    with pytest.raises(RunError, match=r"--step 7: .* holds checkpoints of step\(s\) 1, 2, 3"):
        export_checkpoint(str(ckpt), str(tmp_path / "none"), step=7)
    victim = CheckpointStore(ckpt).latest().path / "block_0.bin"
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 0xFF
    victim.write_bytes(bytes(raw))
    notes = []
    newest_good = export_checkpoint(str(ckpt), str(tmp_path / "good"), say=notes.append)
    assert newest_good.step == 2 and "step-000000003 is damaged" in notes[0]
    assert all(a.equal(b) for a, b in zip(weights(second.folder).values(),
                                          weights(newest_good.folder).values(), strict=True))
    with pytest.raises(RunError, match="fails its CRC32 check.*export another with --step"):
        export_checkpoint(str(ckpt), str(tmp_path / "bad"), step=3)
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.tmp-*"))


def test_a_run_whose_model_folder_is_gone_exports_from_what_its_checkpoint_recorded(
        model_dir, data_file, tmp_path):
    moved = tmp_path / "model"
    shutil.copytree(model_dir, moved)
    assert main(train(moved, data_file, tmp_path)) == 0
    config = json.loads((moved / "config.json").read_text())
    shutil.rmtree(moved)
    done = export_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "exported"))
    assert done.tokenizer is None and f"the run's tokenizer folder {moved} is gone" in \
        done.no_tokenizer
    written = json.loads((done.folder / "config.json").read_text())
    kept = set(config) - {"dtype", "torch_dtype", "transformers_version", "_name_or_path"}
    assert {k: written.get(k) for k in kept} == {k: config[k] for k in kept}


def test_what_export_refuses(tmp_path):
    with pytest.raises(RunError, match="no complete checkpoint there"):
        export_checkpoint(str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(RunError, match="is not a folder of checkpoints"):
        export_checkpoint(str(tmp_path / "none"), str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="exists: pass --overwrite"):
        export_checkpoint(str(tmp_path), str(tmp_path / "out"))


def test_an_export_a_disk_has_no_room_for_is_refused_naming_it(model_dir, data_file,
                                                                tmp_path, small_disk):
    assert main(train(model_dir, data_file, tmp_path)) == 0
    disk = small_disk(100_000)
    with pytest.raises(RunError, match="not enough room for the exported model: "):
        export_checkpoint(str(tmp_path / "ckpt"), str(disk.path / "exported"))
    assert list(disk.path.iterdir()) == []  # nothing written
