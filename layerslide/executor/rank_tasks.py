"""The tasks of several ranks (Lane.GATHER and Lane.REDUCE, executor/ranks.py), part of the
TaskRunner (a mixin: it reads the runner's units, grads and host state). Every rank issues a
lane's collectives in the plan's lane order, on the lane's process group.

A load sends this rank's slice of a block into its offset of the unit and the all-gather fills
the other ranks' slices; a block's grads, flat and padded to the ranks' slices, are reduce-
scattered into this rank's slice (and, across hosts, summed with the same slice's owners);
the clipping norm sums the host's ranks' partial squares.
"""

from __future__ import annotations

import math

import torch

from layerslide.executor.collectives import gather_slices, reduce_scatter_slices, sum_over
from layerslide.executor.units import WeightUnit
from layerslide.kinds import Lane
from layerslide.planner.plan import Task


class RankTasks:
    """The collective task kinds of a TaskRunner, and the gathers outside the plan (an eval)."""

    def _do_gather_weights(self, task: Task) -> None:
        """The other ranks' slices of the block its load sent into the unit."""
        shards = self.shards[task.block]
        gather_slices(self._weight_unit(task).arrivals, self.state.start(task.block),
                      shards.slice_numel, self.ranks.group(task.lane, task.comm_group))

    def fill_unit(self, unit: WeightUnit, block: int, owned: torch.Tensor) -> None:
        """Put a block's bf16 weights in a unit outside the plan (an eval, between segments):
        this rank's slice `owned` into its offset, the others' gathered (on the gather lane's
        group, idle then)."""
        whole = unit.flat if unit.padded is None else unit.padded
        start = self.state.start(block)
        whole[start:start + owned.numel()].copy_(owned)
        if self.sharded:
            gather_slices(whole, start, owned.numel(), self.ranks.group(Lane.GATHER, "host"))

    def _flat_grads(self, key: tuple[int, int, int], lane: str) -> torch.Tensor:
        """The block's grads as one flat bf16 buffer padded to every rank's slices, as the
        collectives take them: the GPU sum's rounding, or autograd's grads copied into one
        (they are a tensor per parameter)."""
        grads, b = self.grads.pop(key), key[2]
        flat = self.padded_grads.pop(key, None)
        if flat is None:
            flat = torch.zeros(self.shards[b].padded_numel, dtype=torch.bfloat16,
                               device=self.device.device)
            for (_, view), grad in zip(self.blocks.views(b, flat), grads, strict=True):
                self.device.keep_for(grad, lane)
                view.copy_(grad)
        self.device.keep_for(flat, lane)
        return flat

    def _do_reduce_grads(self, task: Task) -> None:
        """The block's grads summed over the host's ranks, this rank's slice of them kept."""
        key = self._grads_key(task)
        flat = self._flat_grads(key, task.lane)
        owned = torch.empty(self.state.numel(task.block), dtype=torch.bfloat16,
                            device=self.device.device)
        reduce_scatter_slices(owned, flat, self.ranks.group(task.lane, task.comm_group))
        self.reduced[key] = owned
        if self.ranks.hosts == 1:  # else after the sum across hosts
            self._share_nonfinite(key, task.lane)

    def _do_all_reduce_grads(self, task: Task) -> None:
        """This rank's slice of the grads (the block on a host of one rank) summed with the
        same slice's owners on the other hosts."""
        key = self._grads_key(task)
        if key not in self.reduced:  # one rank a host: the whole block, flat
            self.reduced[key] = self._flat_grads(key, task.lane)
        sum_over(self.reduced[key], self.ranks.group(task.lane, task.comm_group))
        if self.ranks.gpus > 1:
            self._share_nonfinite(key, task.lane)

    def _share_nonfinite(self, key: tuple[int, int, int], lane: str) -> None:
        """The squared norm of this rank's slice of the block's summed grads, made inf where
        any rank's of the host is non-finite, so that all skip the block as one rank would (a
        one-element all-reduce on the lane's host group after its last reduction, too small
        for the simulator to price; across hosts the slices are the same sums already)."""
        sq = torch.linalg.vector_norm(self.reduced[key], dtype=torch.float32).square()
        bad = (~torch.isfinite(sq)).to(torch.float32).reshape(1)
        sum_over(bad, self.ranks.group(lane, "host"))
        self.reduced_sq[key] = torch.where(bad[0] > 0, torch.full_like(sq, math.inf), sq)

    def _do_reduce_norm(self, task: Task) -> None:
        """The host's ranks' partial squared norms summed: every rank clips by the same norm."""
        total = torch.tensor([self.partial_sq.pop(task.step)], dtype=torch.float64)
        sum_over(total, self.ranks.group(task.lane, task.comm_group))
        self._clip(task.step, float(total[0]))
