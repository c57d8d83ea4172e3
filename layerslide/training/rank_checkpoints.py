"""Training-state checkpoints of several ranks, and resuming on another count of ranks.

Each rank of the first host writes its slices of every block (planner/sharding.py) as a
checkpoint of its own, in a folder of its own under the run's checkpoint folder (rank-<r>),
its manifest naming the slice layout (`layout_meta`); the other hosts' ranks hold the same
state and write nothing. One rank writes the plain layout: step folders in the run's folder.

A resume finds the newest step that every writer of a layout holds whole (`saved_steps`). On
the same slices it reads its own rank's checkpoint as one rank always has; on others it cuts
its slices out of the saved ones (`reslice`): every tensor of a block is per element (master,
moments) or per 2048 elements (8-bit moments' scales), and every slice starts on a multiple of
2048, so each of its elements comes from one saved slice, bit for bit. The parts of the saved
slices a run kept on NVMe are read from the state files their checkpoints linked, and a rank
whose own state is partly on NVMe writes its files' parts anew (`reslice_with_disk`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from layerslide.executor.moments import Moments
from layerslide.executor.ranks import Ranks
from layerslide.planner.sharding import Shards
from layerslide.training.checkpoint_store import CheckpointInfo, CheckpointStore
from layerslide.training.saved_slices import SavedSlices, count_of, per_element

RANK_FOLDER = "rank-{:05d}"


def rank_store(store: CheckpointStore, ranks: Ranks) -> CheckpointStore | None:
    """Where this rank writes its checkpoints: the run's store on one rank, a folder of its
    own under it on the first host, nowhere (None) on the others (the same state)."""
    if ranks.world == 1:
        return store
    if ranks.host != 0:
        return None
    return CheckpointStore(store.root / RANK_FOLDER.format(ranks.local_rank),
                           keep_last=store.keep_last, writer_threads=store.writer_threads,
                           direct_writes=store.direct_writes)


def layout_meta(ranks: Ranks, shards: dict[int, Shards]) -> dict:
    """What a rank's checkpoint records of the slices it holds."""
    return {"gpus": ranks.gpus, "hosts": ranks.hosts, "local_rank": ranks.local_rank,
            "numel": {str(b): s.numel for b, s in shards.items()},
            "slice_numel": {str(b): s.slice_numel for b, s in shards.items()}}


@dataclass(frozen=True)
class SavedStep:
    """One step's checkpoint of every slice: its writers' checkpoints, by local rank (one:
    the plain layout), and their stores."""

    step: int
    infos: tuple[CheckpointInfo, ...]
    stores: tuple[CheckpointStore, ...]

    @property
    def gpus(self) -> int:
        return len(self.infos)

    @property
    def meta(self) -> dict:
        return self.infos[0].meta


def saved_steps(store: CheckpointStore) -> list[SavedStep]:
    """Every step held whole in the run's folder, newest first: the plain layout's, and each
    step whose rank-0 checkpoint's writers all hold it (a writer killed mid-save leaves its
    step out). On a tie the sliced one comes first."""
    found = [SavedStep(info.step, (info,), (store,)) for info in store.list()]
    stores, held = {}, {}  # the rank folders there, and each one's checkpoints by step
    for folder in sorted(store.root.glob("rank-*")):
        if folder.is_dir() and folder.name[len("rank-"):].isdigit():
            rank = int(folder.name[len("rank-"):])
            stores[rank] = CheckpointStore(folder, read_only=True)
            held[rank] = {info.step: info for info in stores[rank].list()}
    for step, info in held.get(0, {}).items():
        gpus = _gpus(info)
        infos = [held.get(r, {}).get(step) for r in range(gpus)]
        if all(i is not None and _gpus(i) == gpus for i in infos):
            found.append(SavedStep(step, tuple(infos), tuple(stores[r] for r in range(gpus))))
    return sorted(found, key=lambda s: (s.step, "ranks" in s.meta), reverse=True)


def newest_checkpoint(store: CheckpointStore) -> CheckpointInfo | None:
    """The newest checkpoint in the run's folder, of either layout (several ranks': rank 0's
    of the newest step they all hold whole), or None."""
    found = saved_steps(store)
    return found[0].infos[0] if found else None


def _gpus(info: CheckpointInfo) -> int:
    """Slices per block in a checkpoint's layout (1: the plain one)."""
    return int(info.meta.get("ranks", {}).get("gpus", 1))


def slices_of(saved: SavedStep) -> dict[int, int]:
    """Each block's saved slice size (the plain layout's: the block's size)."""
    layout = saved.meta.get("ranks")
    if layout is None:  # one rank's checkpoint: each group holds its block whole
        return {}
    return {int(b): n for b, n in layout["slice_numel"].items()}


def reslice(saved: SavedStep, into: dict[str, dict[str, torch.Tensor]],
            shards: dict[int, Shards], local_rank: int,
            readers: list[SavedSlices] | None = None) -> None:
    """Fill this rank's groups `into` (block_<b>: tensors of its slice of `shards[b]`) from
    the saved slices, each read with its CRC checked; what no saved slice holds (padding past
    the block) is zero. readers: the saved checkpoints' (kept from one call to the next)."""
    sizes = slices_of(saved)
    readers = readers or [SavedSlices(s, i) for s, i in zip(saved.stores, saved.infos,
                                                              strict=True)]
    for group, tensors in into.items():
        block = int(group.removeprefix("block_"))
        saved_size = sizes.get(block, shards[block].numel)
        for name, target in tensors.items():
            target.zero_()
            per = per_element(name)
            begin = shards[block].start(local_rank) // per
            for rank, reader in enumerate(readers):
                # a slice of 8-bit moments' scales: one per started 2048 elements
                saved_start, stored = rank * saved_size // per, count_of(name, saved_size)
                if _overlap(begin, target.numel(), saved_start, stored):
                    source = reader.tensor(group, name, saved_size)
                    _copy_overlap(target, begin, source, saved_start)


def reslice_with_disk(saved: SavedStep, into: dict[str, dict[str, torch.Tensor]],
                      shards: dict[int, Shards], local_rank: int, state) -> None:
    """reslice for a rank whose state (HostState) keeps the first elements of some blocks'
    slices on NVMe: `into` holds the rest (in RAM); a block at a time, its slice is cut whole
    and its first elements written to the block's state file."""
    readers = [SavedSlices(s, i) for s, i in zip(saved.stores, saved.infos, strict=True)]
    disk = set(state.nvme.disk_blocks)
    for group, in_ram in into.items():
        block = int(group.removeprefix("block_"))
        if block not in disk:
            reslice(saved, {group: in_ram}, shards, local_rank, readers)
            continue
        numel = shards[block].slice_numel
        whole = {name: torch.empty(count_of(name, numel), dtype=t.dtype)
                 for name, t in in_ram.items()}
        reslice(saved, {group: whole}, shards, local_rank, readers)
        on_disk = {name: t[:t.numel() - in_ram[name].numel()] for name, t in whole.items()}
        for name, t in in_ram.items():
            t.copy_(whole[name][on_disk[name].numel():])
        moments = Moments(state.nvme.moment_precision,
                          {k: v for k, v in on_disk.items() if k != "master"})
        state.nvme.update_block(block, master=on_disk["master"], moments=moments)


def _overlap(a_start: int, a_len: int, b_start: int, b_len: int) -> bool:
    return max(a_start, b_start) < min(a_start + a_len, b_start + b_len)


def _copy_overlap(target: torch.Tensor, target_start: int, source: torch.Tensor,
                  source_start: int) -> None:
    """Copy where [source_start, +len) and [target_start, +len) overlap (block indices)."""
    lo = max(target_start, source_start)
    hi = min(target_start + target.numel(), source_start + source.numel())
    target[lo - target_start:hi - target_start].copy_(
        source[lo - source_start:hi - source_start])
