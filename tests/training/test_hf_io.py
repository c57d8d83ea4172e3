"""hf_io: reading Hugging Face checkpoints by header and tensor, atomic sharded saving."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from layerslide.training.hf_io import (
    INDEX_FILE,
    SINGLE_FILE,
    ModelSaveError,
    check_checkpoint,
    checkpoint_tensor_index,
    iter_checkpoint_tensors,
    read_hf_config,
    save_hf_folder,
)

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _llama() -> PreTrainedModel:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


def _qwen2_tied() -> PreTrainedModel:
    torch.manual_seed(1)
    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True)).eval()


def _qwen3_tied() -> PreTrainedModel:
    torch.manual_seed(2)
    return Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True)).eval()


MODELS = {"llama": _llama, "qwen2": _qwen2_tied, "qwen3": _qwen3_tied}


def _saved_state(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The model's state dict minus the tied lm_head, as save_pretrained writes it."""
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    return state


def _logits(model: PreTrainedModel) -> torch.Tensor:
    ids = torch.arange(12).reshape(2, 6) * 7 % 256
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("max_shard_size", [None, "40KB"])
def test_reads_save_pretrained_checkpoints_exactly(
    tmp_path: Path, kind: str, max_shard_size: str | None
) -> None:
    model = MODELS[kind]()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / INDEX_FILE).is_file() == (max_shard_size is not None)
    state = _saved_state(model)

    assert read_hf_config(tmp_path)["model_type"] == kind
    index = checkpoint_tensor_index(tmp_path)
    assert index == {name: (tuple(t.shape), "F32") for name, t in state.items()}

    seen = dict(iter_checkpoint_tensors(tmp_path))
    assert seen.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(seen[name], tensor), name

    check_checkpoint(tmp_path, {name: tuple(t.shape) for name, t in state.items()})


def test_iter_restricts_to_names_and_rejects_unknown(tmp_path: Path) -> None:
    model = _llama()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    wanted = {"model.norm.weight", "model.layers.1.mlp.up_proj.weight"}
    got = dict(iter_checkpoint_tensors(tmp_path, wanted))
    assert got.keys() == wanted
    assert torch.equal(got["model.norm.weight"], model.model.norm.weight)
    with pytest.raises(ValueError, match="no tensor"):
        list(iter_checkpoint_tensors(tmp_path, {"model.nope.weight"}))


def test_reads_unindexed_shards(tmp_path: Path) -> None:
    model = _llama()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    (tmp_path / INDEX_FILE).unlink()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert set(checkpoint_tensor_index(tmp_path)) == set(model.state_dict())


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_hf_folder_loads_with_same_logits(
    tmp_path: Path, kind: str, dtype: torch.dtype
) -> None:
    model = MODELS[kind]()
    target = tmp_path / "out"
    saved = save_hf_folder(target, model.config.to_dict(), _saved_state(model).items(), dtype=dtype)
    assert saved == target.absolute()
    assert sorted(p.name for p in target.iterdir()) == ["config.json", SINGLE_FILE]
    config = json.loads((target / "config.json").read_text())
    name = str(dtype).removeprefix("torch.")
    assert config["dtype"] == config["torch_dtype"] == name
    with safe_open(target / SINGLE_FILE, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}

    loaded = AutoModelForCausalLM.from_pretrained(target).eval()
    _assert_same_model(loaded, model, dtype)


def _assert_same_model(loaded: PreTrainedModel, model: PreTrainedModel, dtype: torch.dtype) -> None:
    """Same weights and logits as `model` cast to dtype."""
    assert loaded.dtype == dtype
    reference = {name: t.to(dtype) for name, t in model.state_dict().items()}
    loaded_state = loaded.state_dict()
    assert loaded_state.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(loaded_state[name], tensor), name
    # The rotary inv_freq buffer is not saved: a loaded model computes it in fp32, while
    # model.to(dtype) rounds it; give the reference the loaded one so logits must match exactly.
    model.to(dtype).model.rotary_emb.inv_freq = loaded.model.rotary_emb.inv_freq.clone()
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=0)


def test_save_hf_folder_shards_and_indexes(tmp_path: Path) -> None:
    model = _qwen3_tied()
    state = _saved_state(model)
    target = tmp_path / "out"
    save_hf_folder(target, model.config.to_dict(), state.items(), max_shard_bytes=30_000)

    index = json.loads((target / INDEX_FILE).read_text())
    shards = sorted(p.name for p in target.glob("*.safetensors"))
    n = len(shards)
    assert n > 1
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in state.values())
    for shard in shards:
        with safe_open(target / shard, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            keys = list(f.keys())
            assert all(index["weight_map"][key] == shard for key in keys)
            # A shard exceeds the limit only when it holds a single oversized tensor.
            shard_bytes = sum(f.get_tensor(key).nbytes for key in keys)
            assert len(keys) == 1 or shard_bytes <= 30_000
    assert not list(tmp_path.glob(".out.*"))

    got = dict(iter_checkpoint_tensors(target))
    assert got.keys() == state.keys()
    for key, tensor in state.items():
        assert torch.equal(got[key], tensor.to(torch.bfloat16)), key
    _assert_same_model(AutoModelForCausalLM.from_pretrained(target), model, torch.bfloat16)


def _failing(tensors: dict[str, torch.Tensor], after: int) -> Iterator[tuple[str, torch.Tensor]]:
    for i, item in enumerate(tensors.items()):
        if i == after:
            raise RuntimeError("boom")
        yield item


@pytest.mark.parametrize("existing", [False, True])
def test_save_hf_folder_is_atomic(tmp_path: Path, existing: bool) -> None:
    model = _llama()
    state = _saved_state(model)
    target = tmp_path / "out"
    if existing:
        target.mkdir()
        (target / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        save_hf_folder(
            target,
            model.config.to_dict(),
            _failing(state, after=len(state) - 2),
            max_shard_bytes=30_000,
            overwrite=True,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])
    if existing:
        assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_a_save_that_fills_its_disk_says_so_and_leaves_the_old_folder(small_disk) -> None:
    model = _llama()
    disk = small_disk(8 << 20)
    target = disk.path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("old")
    disk.fill(leave_bytes=40_000)  # room for a shard or so, not the model
    with pytest.raises(ModelSaveError) as failed:
        save_hf_folder(target, model.config.to_dict(), _saved_state(model).items(),
                       max_shard_bytes=30_000, overwrite=True)
    assert failed.value.no_space
    assert f"writing the model to {target} failed: the disk is full" in str(failed.value)
    assert "the partial copy is deleted" in str(failed.value)
    assert sorted(p.name for p in disk.path.iterdir()) == [".filler", "out"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_save_hf_folder_overwrite(tmp_path: Path) -> None:
    model = _llama()
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("old")
    with pytest.raises(ValueError, match="overwrite=True"):
        save_hf_folder(target, model.config.to_dict(), _saved_state(model).items())
    assert (target / "keep.txt").is_file()

    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text('{"version": "1.0"}')
    save_hf_folder(
        target,
        model.config.to_dict(),
        _saved_state(model).items(),
        overwrite=True,
        extra_files={"tokenizer.json": tokenizer},
    )
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json",
        SINGLE_FILE,
        "tokenizer.json",
    ]
    assert (target / "tokenizer.json").read_text() == tokenizer.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tokenizer.json"]


def test_save_hf_folder_copies_aliased_and_reused_tensors(tmp_path: Path) -> None:
    # One buffer reused for every tensor, as a streaming caller might do: each must be saved
    # with its value at the time it was yielded, and a tensor yielded twice is not shared.
    buffer = torch.zeros(4)

    def reuse() -> Iterator[tuple[str, torch.Tensor]]:
        for i in range(3):
            buffer.fill_(i)
            yield f"t{i}", buffer

    config = {"model_type": "llama"}
    save_hf_folder(tmp_path / "out", config, reuse(), dtype=None)
    got = dict(iter_checkpoint_tensors(tmp_path / "out"))
    assert {k: v.tolist() for k, v in got.items()} == {f"t{i}": [float(i)] * 4 for i in range(3)}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "float32"


def test_save_hf_folder_rejects_bad_input(tmp_path: Path) -> None:
    twice = [("a", torch.zeros(2)), ("a", torch.ones(2))]
    with pytest.raises(ValueError, match="twice"):
        save_hf_folder(tmp_path / "out", {}, twice)
    with pytest.raises(ValueError, match="no tensors"):
        save_hf_folder(tmp_path / "out", {}, [])
    source = tmp_path / "source.json"
    source.write_text("{}")
    for name in ("config.json", "../x.json", "model.safetensors"):
        with pytest.raises(ValueError, match="plain name"):
            save_hf_folder(tmp_path / "out", {}, twice[:1], extra_files={name: source})
    with pytest.raises(ValueError, match="plain name"):
        save_hf_folder(tmp_path / "out", {}, twice[:1], extra_files={"a.json": tmp_path / "nope"})
    source.unlink()
    assert list(tmp_path.iterdir()) == []


def test_save_hf_folder_unwritable_destination(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=str(blocker)):
        save_hf_folder(blocker / "out", {}, [("a", torch.zeros(2))])


def test_check_checkpoint_reports_differences(tmp_path: Path) -> None:
    model = _qwen2_tied()
    model.save_pretrained(tmp_path)
    expected = {name: tuple(t.shape) for name, t in _saved_state(model).items()}
    check_checkpoint(tmp_path, expected)

    bad = dict(expected)
    del bad["model.norm.weight"]
    bad["model.layers.0.self_attn.q_proj.bias"] = (1,)
    bad["model.extra.weight"] = (3,)
    with pytest.raises(ValueError, match="config.json does not match") as info:
        check_checkpoint(tmp_path, bad)
    message = str(info.value)
    assert "1 missing: model.extra.weight" in message
    assert "1 unexpected: model.norm.weight" in message
    assert "model.layers.0.self_attn.q_proj.bias (expected (1,), checkpoint (64,))" in message

    # The tied lm_head in a checkpoint is tolerated by default, not when ignore is narrowed.
    with_head = tmp_path / "with_head"
    save_hf_folder(with_head, model.config.to_dict(), model.state_dict().items())
    check_checkpoint(with_head, expected)
    with pytest.raises(ValueError, match="1 unexpected: lm_head.weight"):
        check_checkpoint(with_head, expected, ignore=())


def test_check_checkpoint_lists_a_few_names(tmp_path: Path) -> None:
    _llama().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="config.json does not match") as info:
        check_checkpoint(tmp_path, {})
    assert "20 unexpected" in str(info.value)  # 21 tensors; the untied lm_head is ignorable
    assert "and 15 more" in str(info.value)


def _write_config(folder: Path, **config: object) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))


def test_read_hf_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        read_hf_config(tmp_path / "nope")
    with pytest.raises(ValueError, match="config.json is missing"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_hf_config(tmp_path)
    _write_config(tmp_path, model_type="gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not supported.*llama, qwen2, qwen3, mistral"):
        read_hf_config(tmp_path)
    _write_config(tmp_path, model_type="mistral")
    assert read_hf_config(tmp_path) == {"model_type": "mistral"}


def test_missing_safetensors_errors(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"\.bin/pickle checkpoints are not supported.*convert"):
        checkpoint_tensor_index(tmp_path)

    sharded = tmp_path / "sharded"
    _llama().save_pretrained(sharded, max_shard_size="40KB")
    second = sorted(sharded.glob("*.safetensors"))[1]
    second.unlink()
    with pytest.raises(ValueError, match=f"missing shard.*{second.name}"):
        checkpoint_tensor_index(sharded)
    with pytest.raises(ValueError, match="missing shard"):
        next(iter_checkpoint_tensors(sharded))


def test_a_killed_saves_leftovers_go_and_a_live_saves_stay(tmp_path: Path) -> None:
    import subprocess
    import sys

    model = _qwen3_tied()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    killed = tmp_path / f".run[1].tmp-{dead}"  # a save killed mid-write, by its pid
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    alive = tmp_path / f".run[1].tmp-{os.getppid()}"  # a save running beside this one
    alive.mkdir()
    save_hf_folder(tmp_path / "run[1]", model.config.to_dict(), _saved_state(model).items())
    assert not killed.exists() and alive.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "run[1]"]
