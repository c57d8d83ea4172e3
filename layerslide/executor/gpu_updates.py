"""Blocks the plan updates on the GPU: fp32 master weights, AdamW moments and fp32 grad sums
stay in GPU memory, torch's fused CUDA AdamW updates them after the step's backwards, and the
block's bf16 weights (its dedicated GPU unit) are refreshed in place. They never cross PCIe and
cost the CPU nothing: GPU memory (18 B/param with fp32 moments) spent to buy CPU time when the
CPU bounds the step. Compact moments (bf16, 8-bit) are updated by executor/moments.py's torch
step, the same arithmetic as the CPU's native kernel.

A step with non-finite grads is skipped on the GPU itself (the kernel's found_inf flag), so the
host never waits for the GPU to decide.
"""

from __future__ import annotations

import torch

from layerslide.executor.blocks import ModelBlocks
from layerslide.executor.moments import Moments, moment_seed, torch_adamw_step
from layerslide.executor.optim import OptimConfig
from layerslide.planner.settings import MomentPrecision


def add_into_sum(blocks: ModelBlocks, block: int, flat_sum: torch.Tensor,
                 grads: list[torch.Tensor], first: bool) -> None:
    """Add one micro-batch's grads (in layout order) into the block's flat fp32 sum; the first
    micro-batch's start it. A None grad is one already added (grad_into_sum)."""
    for (_, view), grad in zip(blocks.views(block, flat_sum), grads, strict=True):
        if grad is None:
            continue
        if first:
            view.copy_(grad)
        else:
            view.add_(grad)


class GpuUpdatedBlocks:
    """The GPU-side training state of the blocks in `block_ids`."""

    def __init__(self, blocks: ModelBlocks, block_ids: list[int], device: torch.device,
                 optim: OptimConfig, moment_precision: MomentPrecision = "fp32"):
        self.blocks, self.optim = blocks, optim
        self.ids = list(block_ids)
        self.master = {b: torch.empty(blocks.numel(b), device=device) for b in self.ids}
        self.moments = {b: Moments.zeros(moment_precision, blocks.numel(b), device=device)
                        for b in self.ids}
        self.grad_sum = {b: torch.empty(blocks.numel(b), device=device) for b in self.ids}
        self.steps = {b: torch.zeros((), device=device) for b in self.ids}
        self.found_inf: dict[tuple[int, int], torch.Tensor] = {}  # (step, block) -> 0/1

    def state_bytes(self) -> int:
        """GPU bytes of the fp32 master weights, moments and grad sums (the step counters aside)."""
        return (sum(t.numel() * t.element_size() for group in (self.master, self.grad_sum)
                    for t in group.values())
                + sum(moments.nbytes for moments in self.moments.values()))

    def __contains__(self, block: int) -> bool:
        return block in self.master

    def load(self, block: int, host_master: torch.Tensor, weights_bf16: torch.Tensor) -> None:
        """Copy the host's fp32 master weights in and refresh the bf16 weights the GPU uses."""
        self.master[block].copy_(host_master)
        weights_bf16.copy_(self.master[block])

    def store(self, block: int, host_master: torch.Tensor) -> None:
        """Copy the fp32 master weights back to the host (for saving)."""
        host_master.copy_(self.master[block])

    def grad_sq_norm(self, block: int) -> torch.Tensor:
        """Squared L2 norm of the block's grad sum, as a GPU scalar (no host sync)."""
        return torch.linalg.vector_norm(self.grad_sum[block]).square()

    def step(self, block: int, step: int, lr: float, clip_coef: float) -> None:
        """One AdamW step with grads scaled by clip_coef; skipped on the GPU if they are not
        finite. Then the bf16 weights are refreshed by the caller-given unit."""
        grads = self.grad_sum[block]
        if clip_coef != 1.0:
            grads.mul_(clip_coef)
        found_inf = (~torch.isfinite(self.grad_sq_norm(block))).float()
        self.found_inf[(step, block)] = found_inf
        split = self.blocks.decay_numel(block)
        self.steps[block] += 1
        moments = self.moments[block]
        if moments.precision != "fp32":
            step_count = self.steps[block].long()  # a GPU scalar: no host sync
            torch_adamw_step(self.master[block], moments, grads, decay_end=split, lr=lr,
                             beta1=self.optim.beta1, beta2=self.optim.beta2, eps=self.optim.eps,
                             weight_decay=self.optim.weight_decay, grad_scale=1.0,
                             step=step_count, seed=moment_seed(block, step_count),
                             skip=found_inf)
            self.steps[block] -= found_inf
            return
        for part, decay in ((slice(0, split), self.optim.weight_decay), (slice(split, None), 0.0)):
            params = self.master[block][part]
            if params.numel() == 0:
                continue
            torch._fused_adamw_(  # the kernel behind torch.optim.AdamW(fused=True)
                [params], [grads[part]], [moments.tensors["exp_avg"][part]],
                [moments.tensors["exp_avg_sq"][part]], [], [self.steps[block]], lr=lr,
                beta1=self.optim.beta1, beta2=self.optim.beta2, weight_decay=decay,
                eps=self.optim.eps, amsgrad=False, maximize=False, grad_scale=None,
                found_inf=found_inf)
        self.steps[block] -= found_inf  # a skipped step does not count

    def refresh(self, block: int, weights_bf16: torch.Tensor) -> None:
        weights_bf16.copy_(self.master[block])
