"""Read and write Hugging Face checkpoint folders (config.json + safetensors) one tensor at a time,
so host memory holds at most one tensor (reading) or one shard (writing) beyond the caller's."""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Checkpoint names a model built from config.json may lack: rotary buffers saved by old exports,
# and lm_head.weight when the config ties it to the embeddings (transformers drops it on load).
DEFAULT_IGNORE = ("rotary_emb.inv_freq", "lm_head.weight")
_MAX_LISTED = 5
# a tokenizer's files (and chat template), saved beside the weights it was trained with
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "special_tokens_map.json", "generation_config.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json")


class ModelSaveError(ValueError):
    """Writing a model folder failed; nothing partial is left. no_space: for want of room."""

    def __init__(self, message: str, *, no_space: bool):
        super().__init__(message)
        self.no_space = no_space


def tokenizer_files(folder: Path | None) -> dict[str, Path]:
    """The tokenizer's files in folder, by name (none for None or a folder without them)."""
    return {name: folder / name for name in TOKENIZER_FILES
            if folder is not None and (folder / name).is_file()}


def read_hf_config(folder: str | Path) -> dict:
    """Load folder/config.json and check that its model_type is one layerslide supports."""
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise ValueError(f"{folder} is not a folder; pass a Hugging Face checkpoint folder")
    if not path.is_file():
        raise ValueError(f"{path} is missing; put the model's config.json in {folder}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or re-download it") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object")  # noqa: TRY004 (bad input: ValueError)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: model_type {model_type!r} is not supported; "
            f"use a checkpoint of one of: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def _shard_names(folder: Path) -> dict[Path, list[str] | None]:
    """Map each safetensors shard to the tensor names the index gives it (None: all in it)."""
    index_path = folder / INDEX_FILE
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map") or {}
        shards: dict[Path, list[str]] = defaultdict(list)
        for name, file in weight_map.items():
            shards[folder / file].append(name)
        missing = sorted(str(p.name) for p in shards if not p.is_file())
        if missing:
            raise ValueError(
                f"{index_path} names missing shard(s) {', '.join(missing)}; "
                "re-download the checkpoint"
            )
        return dict(shards)
    if (folder / SINGLE_FILE).is_file():
        return {folder / SINGLE_FILE: None}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"no *.safetensors files in {folder}; .bin/pickle checkpoints are not supported, "
            "convert them to safetensors (e.g. load and save_pretrained with transformers)"
        )
    return dict.fromkeys(files)


def checkpoint_tensor_index(folder: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, safetensors dtype) for the whole checkpoint, from headers only."""
    index: dict[str, tuple[tuple[int, ...], str]] = {}
    for path, names in _shard_names(Path(folder)).items():
        with _opened(path) as f:
            present = set(f.keys())
            for name in present if names is None else names:
                if name not in present:
                    raise ValueError(f"{INDEX_FILE} puts {name} in {path.name}, which lacks it")
                tensor_slice = f.get_slice(name)
                index[name] = (tuple(tensor_slice.get_shape()), tensor_slice.get_dtype())
    return index


def _opened(path: Path):
    """safe_open of one shard, its header and length checked (a truncated or damaged file is
    refused by name before any weight is read)."""
    try:
        return safe_open(path, framework="pt")
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}): it may be "
                         "truncated or damaged; download or save it again") from err


def finite_tensors(items: Iterable[tuple[str, torch.Tensor]], folder: str | Path,
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The items, refusing a tensor that holds NaN or inf (every step would be skipped)."""
    for name, tensor in items:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{folder}: {name} holds NaN or inf values; training from it "
                             "would skip every step: use an intact copy of the weights")
        yield name, tensor


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def check_checkpoint(
    folder: str | Path,
    expected: dict[str, tuple[int, ...]],
    *,
    ignore: Iterable[str] = DEFAULT_IGNORE,
) -> None:
    """Raise ValueError unless the checkpoint holds exactly the expected names and shapes.

    Unexpected checkpoint names that end with, or fnmatch, an `ignore` pattern are tolerated."""
    found = {name: shape for name, (shape, _) in checkpoint_tensor_index(folder).items()}
    patterns = tuple(ignore)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(
        name
        for name in set(found) - set(expected)
        if not any(name.endswith(p) or fnmatch.fnmatchcase(name, p) for p in patterns)
    )
    mismatched = sorted(
        f"{name} (expected {tuple(expected[name])}, checkpoint {found[name]})"
        for name in set(expected) & set(found)
        if tuple(expected[name]) != found[name]
    )
    problems = [
        f"{len(items)} {kind}: {_listed(items)}"
        for kind, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("shape-mismatched", mismatched),
        )
        if items
    ]
    if problems:
        raise ValueError(
            f"config.json does not match the safetensors in {folder}: {'; '.join(problems)}; "
            "use the config.json that came with these weights"
        )


def iter_checkpoint_tensors(
    folder: str | Path, names: Iterable[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) shard by shard, one tensor at a time; `names` restricts the set."""
    shards = _shard_names(Path(folder))
    wanted = None if names is None else set(names)
    if wanted is not None:
        absent = sorted(wanted - set(checkpoint_tensor_index(folder)))
        if absent:
            raise ValueError(f"{folder} has no tensor(s) {_listed(absent)}")
    for path, shard_names in shards.items():
        with _opened(path) as f:
            for name in f.keys() if shard_names is None else shard_names:
                if wanted is None or name in wanted:
                    yield name, f.get_tensor(name)


def fsync_path(path: Path) -> None:
    """fsync a file or directory by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _for_saving(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A contiguous CPU copy of `tensor` (floating point ones in `dtype`) owning its storage."""
    to_dtype = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    out = tensor.detach().to(device="cpu", dtype=to_dtype).contiguous()
    # Copy when `out` aliases the caller's memory: the caller may reuse it once we ask for the next
    # tensor, and safetensors refuses tensors that share storage (tied weights, flat buffers).
    if out.untyped_storage().nbytes() != out.nbytes or out.data_ptr() == tensor.data_ptr():
        out = out.clone()
    return out


def _write_shards(
    tmp: Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    max_shard_bytes: int,
    dtype: torch.dtype | None,
) -> tuple[list[Path], dict[str, int], int, torch.dtype | None]:
    """Write shards under temporary names; return their paths, name -> shard, bytes, a dtype."""
    shards: list[Path] = []
    weight_map: dict[str, int] = {}
    total_bytes = 0
    saved_dtype = dtype
    buffer: dict[str, torch.Tensor] = {}
    buffer_bytes = 0

    def flush() -> None:
        path = tmp / f"shard-{len(shards) + 1:05d}.safetensors.tmp"
        save_file(buffer, path, metadata={"format": "pt"})
        fsync_path(path)
        shards.append(path)
        buffer.clear()

    for name, tensor in tensors:
        if name in weight_map:
            raise ValueError(f"tensor {name} is given twice")
        out = _for_saving(tensor, dtype)
        if saved_dtype is None and out.is_floating_point():
            saved_dtype = out.dtype
        if buffer and buffer_bytes + out.nbytes > max_shard_bytes:
            flush()
            buffer_bytes = 0
        buffer[name] = out
        buffer_bytes += out.nbytes
        total_bytes += out.nbytes
        weight_map[name] = len(shards)
    if not weight_map:
        raise ValueError("no tensors to save")
    flush()
    return shards, weight_map, total_bytes, saved_dtype


def save_hf_folder(
    folder: str | Path,
    config: dict,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    max_shard_bytes: int = 5 * 2**30,
    dtype: torch.dtype | None = torch.bfloat16,
    extra_files: dict[str, Path] | None = None,
    overwrite: bool = False,
) -> Path:
    """Atomically write a from_pretrained-loadable folder, consuming `tensors` shard by shard."""
    target = Path(folder).absolute()
    if target.exists() and not (overwrite and target.is_dir()):
        hint = "pass overwrite=True or " if target.is_dir() else ""
        raise ValueError(f"{target} exists; {hint}choose another folder")
    for name, source in (extra_files or {}).items():
        # Extra files must not escape the folder or replace what this function writes.
        reserved = name in ("..", "config.json", INDEX_FILE) or name.endswith(".safetensors")
        if Path(name).name != name or reserved or not Path(source).is_file():
            raise ValueError(
                f"extra file {name!r}: {source} must be a file, saved under a plain name "
                "other than config.json and the weight files"
            )
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
            if not _owner_alive(stale):  # a killed save's whole-model leftovers (ours too)
                shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise ValueError(
            f"cannot write to {target.parent} ({exc}); choose a writable folder"
        ) from exc
    try:
        shards, weight_map, total_bytes, saved_dtype = _write_shards(
            tmp, tensors, max_shard_bytes, dtype
        )
        n = len(shards)
        files = (
            [SINGLE_FILE]
            if n == 1
            else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        )
        for shard, file in zip(shards, files, strict=True):
            shard.rename(tmp / file)
        written = [tmp / f for f in files]
        if n > 1:
            index = {
                "metadata": {"total_size": total_bytes},
                "weight_map": {k: files[v] for k, v in sorted(weight_map.items())},
            }
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
            written.append(tmp / INDEX_FILE)
        config = dict(config)
        if saved_dtype is not None:
            config["torch_dtype"] = config["dtype"] = str(saved_dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        written.append(tmp / "config.json")
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, tmp / name)
            written.append(tmp / name)
        for path in written:
            fsync_path(path)
        fsync_path(tmp)
        _replace(tmp, target)
    except (OSError, SafetensorError) as err:  # a full disk, mostly: said as what to do
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_failed(target, err) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _save_failed(target: Path, err: Exception) -> ModelSaveError:
    """What a failed write of a model folder says (its partial copy is deleted by then)."""
    no_space = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
        "No space left" in str(err) or "os error 28" in str(err))
    why = ("the disk is full" if no_space else "the write failed") + f" ({err})"
    return ModelSaveError(f"writing the model to {target} failed: {why}; the partial copy is "
                          f"deleted, {free_space_at(target.parent)} free there now",
                          no_space=no_space)


def free_space_at(folder: Path) -> str:
    """The free bytes on folder's disk, said as the space checks say them."""
    from layerslide.outputs import free_bytes, size

    return size(free_bytes(folder))


def _owner_alive(tmp: Path) -> bool:
    """Whether another process that named a temporary save folder (.NAME.tmp-PID) still runs:
    a save beside ours, into the same folder, is left alone; our own pid's is a crashed
    run's that had it."""
    pid = tmp.name.rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _replace(tmp: Path, target: Path) -> None:
    """Rename tmp to target; an existing target is renamed aside first and deleted after."""
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        target.rename(old)
        try:
            tmp.rename(target)
        except BaseException:
            old.rename(target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)
    fsync_path(target.parent)
