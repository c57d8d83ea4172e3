"""`layerslide export CHECKPOINT_DIR --out FOLDER`: a training-state checkpoint's model as a
Hugging Face folder (bf16 safetensors, config.json, the tokenizer and chat template the run
used), the way back to a model whose final save failed, was killed, or was never asked for.

It reads a block at a time, CRC-checked: the block's fp32 master weights from the checkpoint's
group file and, where the run kept part of them on NVMe, from the state files the checkpoint
linked (NvmeState's layout: the master part first); a checkpoint of several ranks, from each
rank's slice of the block (training/rank_checkpoints.py). Nothing of the training state is
allocated beyond one block, and no GPU or data is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from layerslide import hub
from layerslide.training.run import RunError


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What an export wrote: the folder, the checkpoint (of several ranks: their folders'
    parent) and step it came from, the tokenizer folder whose files went along (None: none
    did) and why not, where none did."""

    folder: Path
    checkpoint: Path
    step: int
    checkpoint_meta: dict
    tokenizer: Path | None
    no_tokenizer: str | None
    weights_bytes: int
    slices: int = 1  # ranks whose slices of each block it joined


def export_checkpoint(root: str, out: str, *, step: int | None = None,
                      overwrite: bool = False,
                      say: Callable[[str], None] = print) -> Exported:
    """Write the model of a checkpoint in root (step: that step's; else the newest whose
    checksums hold) into the folder out. Errors are RunErrors that say what to change."""
    from layerslide.outputs import writable_folder
    from layerslide.training.checkpoint_store import CheckpointCorruptError

    writable_folder("--out", out, overwrite=overwrite)
    candidates = _checkpoints(root, step)
    for saved in candidates:
        try:
            return _export(saved, Path(out).expanduser(), overwrite)
        except CheckpointCorruptError as err:
            if step is not None or saved is candidates[-1]:
                raise RunError(f"{err}; export another with --step") from err
            say(f"note: {saved.infos[0].path} is damaged ({err}): exporting the one before it")
    raise AssertionError("unreachable: _checkpoints returns at least one")


def _checkpoints(root: str, step: int | None):
    """The saved steps to try, newest first (the one of `step` alone)."""
    from layerslide.training.checkpoint_store import CheckpointError, CheckpointStore
    from layerslide.training.rank_checkpoints import saved_steps

    try:
        store = CheckpointStore(Path(root).expanduser(), read_only=True)
        kept = saved_steps(store)
    except CheckpointError as err:
        raise RunError(f"{root}: {err}: give the folder a run's --checkpoint-dir named") from err
    if not kept:
        raise RunError(f"{root}: no complete checkpoint there (a run writes them with "
                       "--checkpoint-dir)")
    if step is None:
        return kept
    chosen = [saved for saved in kept if saved.step == step]
    if not chosen:
        raise RunError(f"--step {step}: {root} holds checkpoints of step(s) "
                       f"{', '.join(str(s.step) for s in kept[::-1])}: give one of them")
    return chosen[:1]


def _export(saved, out: Path, overwrite: bool) -> Exported:
    from layerslide.executor.blocks import ModelBlocks
    from layerslide.training.hf_io import save_hf_folder, tokenizer_files
    from layerslide.training.output_space import check_output_space, export_need

    info = saved.infos[0]
    hf_config = _hf_config(info)
    blocks = ModelBlocks(hf_config)
    tokenizer, no_tokenizer = _tokenizer_of(info)
    params = sum(blocks.numel(b) for b in blocks.blocks)
    check_output_space([export_need(params, tokenizer, str(out))], "the exported model")
    config = hf_config.to_dict()
    config.pop("_attn_implementation_autoset", None)
    folder = save_hf_folder(out, config, _named_master(saved, blocks),
                            overwrite=overwrite, extra_files=tokenizer_files(tokenizer))
    checkpoint = info.path if saved.gpus == 1 else info.path.parent.parent
    return Exported(folder=folder, checkpoint=checkpoint, step=saved.step,
                    checkpoint_meta=info.meta, tokenizer=tokenizer,
                    no_tokenizer=no_tokenizer, weights_bytes=2 * params, slices=saved.gpus)


def _hf_config(info):
    """The HF config the run trained: as its checkpoint recorded it, else (a checkpoint
    written before it did) its --model folder's config.json, or the preset's."""
    from transformers import CONFIG_MAPPING, AutoConfig

    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.planner.model import ModelSpec

    recorded = info.meta.get("run", {}).get("hf_config")
    if recorded is not None:
        return CONFIG_MAPPING[recorded["model_type"]].from_dict(recorded)
    model = info.meta.get("run", {}).get("args", {}).get("model")
    folder = Path(model).expanduser() if model else None
    if folder is not None and (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    if folder is not None and folder.is_absolute():
        raise RunError(f"{info.path} was written by a run of {folder}, which is gone, and does "
                       "not record its config.json: put the model folder back there to export")
    return hf_config_from_spec(ModelSpec.from_dict(info.meta["model"]))


def _tokenizer_of(info) -> tuple[Path | None, str | None]:
    """The tokenizer folder the run read its data with (its --tokenizer, else its --model
    folder), and why none goes along where none does."""
    args = info.meta.get("run", {}).get("args", {})
    named = args.get("tokenizer") or args.get("model")
    if named and hub.is_model_id(named):  # its snapshot in huggingface_hub's cache
        try:
            return hub.model_folder(named, hub.MODEL_FILES_BUT_WEIGHTS), None
        except ValueError as err:
            return None, f"the run's Hub model's tokenizer: {err}"
    if not named or not Path(named).expanduser().is_absolute():
        return None, "the run had no tokenizer folder (a preset's random weights)"
    folder = Path(named).expanduser()
    if not folder.is_dir():
        return None, f"the run's tokenizer folder {folder} is gone: copy its files in"
    return folder, None


def _named_master(saved, blocks) -> Iterator:
    """(name, fp32 tensor) of every parameter, a block at a time: its slices joined (one
    slice, the whole block, where one rank wrote it)."""
    import torch

    from layerslide.planner.sharding import Shards
    from layerslide.training.rank_checkpoints import reslice
    from layerslide.training.saved_slices import SavedSlices

    readers = [SavedSlices(s, i) for s, i in zip(saved.stores, saved.infos, strict=True)]
    for b in blocks.blocks:
        whole = torch.empty(blocks.numel(b), dtype=torch.float32)
        reslice(saved, {f"block_{b}": {"master": whole}}, {b: Shards(whole.numel(), 1)}, 0,
                readers)
        for slot, view in blocks.views(b, whole):
            yield slot.name, view
