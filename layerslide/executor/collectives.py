"""The collectives of several ranks (executor/ranks.py), each on the process group its caller
names: CPU tensors go through gloo, CUDA ones through NCCL on the caller's current stream (the
lane's: LaneDevice.on), so a lane's collectives run in its order after what it waits for.

A block's slices (planner/sharding.py) lie back to back in one flat padded buffer: rank r's
at r * slice_numel. Equal slices are what all-gather and reduce-scatter into one buffer need.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from layerslide.planner.sharding import Shards


def gather_slices(flat: torch.Tensor, start: int, slice_numel: int, group: object) -> None:
    """Fill `flat` with every rank's slice from each one's own part: this rank's lies at
    `start` already (an in-place all-gather, as gloo and NCCL allow)."""
    dist.all_gather_single(flat, flat[start:start + slice_numel], group=group)


def reduce_scatter_slices(owned: torch.Tensor, flat: torch.Tensor, group: object) -> None:
    """`owned` = this rank's slice of the sum over the group's ranks of their `flat`."""
    dist.reduce_scatter_single(owned, flat, group=group)


def sum_over(tensor: torch.Tensor, group: object) -> None:
    """Sum `tensor` in place over the group's ranks."""
    dist.all_reduce(tensor, group=group)


def whole_from_slices(owned: torch.Tensor, shards: Shards, local_rank: int,
                      group: object) -> torch.Tensor:
    """The whole block (its numel elements) from every rank's slice `owned` of it."""
    if shards.ranks == 1:
        return owned
    flat = torch.empty(shards.padded_numel, dtype=owned.dtype, device=owned.device)
    start = shards.start(local_rank)
    flat[start:start + shards.slice_numel].copy_(owned)
    gather_slices(flat, start, shards.slice_numel, group)
    return flat[:shards.numel]


def owned_part(whole: torch.Tensor, shards: Shards, local_rank: int) -> torch.Tensor:
    """This rank's slice of a whole block's values: a zero-padded copy (the block itself on
    one rank)."""
    if shards.ranks == 1:
        return whole
    start, stop = shards.real(local_rank)
    part = torch.zeros(shards.slice_numel, dtype=whole.dtype, device=whole.device)
    part[:stop - start].copy_(whole[start:stop])
    return part
