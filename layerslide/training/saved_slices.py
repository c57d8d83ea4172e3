"""A checkpoint's tensors of a block's saved slice, whole: the part its run kept on NVMe (the
state file the checkpoint linked, laid out as NvmeState writes it) before the part it kept in
RAM (the checkpoint's group file). A slice is a whole block where one rank wrote it.

What part of the slice was on disk is not recorded: it is what the group file lacks (the
slice's elements less the stored ones), and the moments' precision is the stored dtype's.
"""

from __future__ import annotations

import torch

from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS
from layerslide.training.checkpoint_store import CheckpointInfo, CheckpointStore

# tensors of a block's group kept one per MOMENT_BLOCK_ELEMENTS elements (executor/moments.py)
PER_SCALE_BLOCK = ("exp_avg_scale", "exp_avg_sq_scale")
_PRECISION = {torch.uint8: "int8", torch.bfloat16: "bf16", torch.float32: "fp32"}


def per_element(name: str) -> int:
    """Elements of the slice each value of the named tensor stands for."""
    return MOMENT_BLOCK_ELEMENTS if name in PER_SCALE_BLOCK else 1


def count_of(name: str, numel: int) -> int:
    """Values of the named tensor for `numel` elements (8-bit scales: one per started block)."""
    return -(-numel // per_element(name))


class SavedSlices:
    """Reads one writer's checkpoint a block at a time; its linked files are listed (and their
    CRCs checked) once, at the first block with a part on NVMe."""

    def __init__(self, store: CheckpointStore, info: CheckpointInfo):
        self.store, self.info = store, info
        self._linked = None

    def tensor(self, group: str, name: str, slice_numel: int) -> torch.Tensor:
        """The named tensor of the block's saved slice of `slice_numel` elements, whole."""
        from layerslide.executor.nvme import disk_parts, read_stripes, state_file_stripes

        in_ram = self.store.read_tensor(self.info, group, name).reshape(-1)
        if in_ram.numel() == count_of(name, slice_numel):
            return in_ram
        stored = self.store.stored(self.info, group)
        dtype, kept = stored.get("exp_avg", (torch.float32, slice_numel))
        parts = disk_parts(_PRECISION[dtype], slice_numel - stored["master"][1],
                           slice_numel - kept)
        start, count, dtype = parts[name]
        if self._linked is None:
            self._linked = self.store.linked_files(self.info)
        block = int(group.removeprefix("block_"))
        raw = read_stripes(state_file_stripes(self._linked, block), start,
                           count * dtype.itemsize)
        on_disk = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else in_ram[:0]
        return torch.cat([on_disk, in_ram])
