"""The room a run's outputs take: a checkpoint's size against one written, rotated outputs'
peak counts, and the refusal of outputs that would fill their disk (on a small filesystem)."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from layerslide.cli.main import main
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import model_from_hf_config
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.output_space import (
    CHECKPOINT_PADDING_PER_BLOCK,
    Need,
    check_output_space,
    checkpoint_bytes,
    rotated_peak,
    size,
)
from layerslide.training.run import RunError


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-config")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                max_position_embeddings=64).save_pretrained(path)
    return path


@pytest.mark.parametrize("flags", [
    [], ["--moment-precision", "int8"],
    ["--moments-on-nvme", "0.5", "--master-on-nvme", "0.5"]])
def test_a_checkpoints_size_is_what_a_run_writes(config_dir, tmp_path, small_disk, flags):
    """Its NVMe files are counted where they are copied: a checkpoint on another disk."""
    nvme = (["--nvme-dir", str(small_disk(64 << 20).path / "nvme")] if "0.5" in flags
            else [])
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--model", str(config_dir), "--random-init", "--device", "cpu",
                 "--steps", "1", "--micro-batch", "1", "--seq-len", "16", *flags, *nvme,
                 "--checkpoint-dir", str(ckpt)]) == 0
    written = CheckpointStore(ckpt).latest().total_bytes
    spec = model_from_hf_config(config_dir)
    policy = Policy.of(**{flag[2:].replace("-", "_"): (float(value) if "nvme" in flag else value)
                          for flag, value in zip(flags[::2], flags[1::2], strict=True)})
    plan = build_repeatable_plan(spec, TrainSpec(micro_batch=1, seq_len=16), policy)
    estimate = checkpoint_bytes(plan, nvme_files_copied=bool(nvme))
    assert written <= estimate <= written + CHECKPOINT_PADDING_PER_BLOCK * (spec.num_layers + 2)


@pytest.mark.parametrize(("existing", "written", "keep", "peak"), [
    (0, 0, 2, 0), (0, 1, 2, 1), (0, 2, 2, 2), (0, 9, 2, 3),  # keep 2 and the one being written
    (2, 1, 2, 1), (2, 5, 2, 1), (1, 5, 2, 2), (4, 3, 2, 1)])  # a resume's, already on disk
def test_rotated_outputs_peak_at_keep_and_the_one_being_written(existing, written, keep, peak):
    assert rotated_peak(existing, written, keep) == peak


def test_outputs_sharing_a_disk_are_refused_together_with_the_numbers(small_disk):
    disk = small_disk(2_000_000)
    needs = [Need("--out", str(disk.path / "model"), 1_500_000, "the model", "fix the out"),
             Need("--log-jsonl", str(disk.path / "log"), 600_000, "logs", "fix the log")]
    check_output_space(needs[:1])  # alone it fits
    with pytest.raises(RunError) as refused:
        check_output_space(needs)
    message = str(refused.value)
    assert (f"--out {disk.path / 'model'} needs 1.50 MB (the model); --log-jsonl "
            f"{disk.path / 'log'} needs 600.00 kB (logs), 2.10 MB in all, where the disk of "
            f"{disk.path}") in message or not disk.real
    assert "2.10 MB in all" in message and "fix the out; or fix the log" in message
    free = int(message.split(" bytes) free")[0].rsplit("(", 1)[1])
    assert free <= 2_000_000 + 4096  # tmpfs rounds its size to pages
    assert f"free {size(2_100_000 - free)} there" in message
