"""Layer-major weight grads straight into the block's fp32 sum.

A decoder layer's backward in a sweep of several micro-batches would otherwise have autograd
write each weight's bf16 grad and then add it into the fp32 sum: a second pass over 10 B per
parameter, each micro-batch, and a bf16 rounding of every micro-batch's grad. Here each linear
layer's weight-grad GEMM accumulates into its view of the sum itself (cuBLAS with an fp32
output, beta 1), so the grad is rounded once, in fp32, and never exists in bf16
(benchmarks/results/archive/lm_gap_2026-12-02: 3.2x less time over a 3B layer's GEMMs at 4k tokens).

The sum views ride on the linear modules as buffers, which torch.compile takes as graph inputs
like the parameters (one graph still serves every cache unit); the accumulation is a custom op
that declares its mutation, so Inductor calls it in place. Without a sum attached a routed
linear is nn.Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from layerslide.executor.blocks import ModelBlocks

SUM_BUFFER = "grad_sum"


@torch.library.custom_op("layerslide::add_weight_grad", mutates_args=("total",))
def add_weight_grad(total: torch.Tensor, grad_out: torch.Tensor, inp: torch.Tensor) -> None:
    """total += grad_out^T @ inp over all tokens, accumulated and added in fp32."""
    g = grad_out.reshape(-1, grad_out.shape[-1])
    x = inp.reshape(-1, inp.shape[-1])
    if total.is_cuda:
        torch.ops.aten.addmm.dtype_out(total, g.T, x, torch.float32, out=total)
    else:  # no bf16 -> fp32 GEMM on the CPU: the same sum through fp32 operands
        total.addmm_(g.T.float(), x.float())


@add_weight_grad.register_fake
def _(total: torch.Tensor, grad_out: torch.Tensor, inp: torch.Tensor) -> None:
    return None


class _LinearIntoSum(torch.autograd.Function):
    """y = x W^T + b whose backward adds W's grad into `total` and gives W none."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                total: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, total = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        # not saved_tensors: the backwards of the block's other linears add into the same
        # flat sum, which autograd's version check would take for a stale saved input
        ctx.total = total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, weight = ctx.saved_tensors
        add_weight_grad(ctx.total, grad_out, x)
        grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_out @ weight, None, grad_bias, None


class SumLinear(nn.Linear):
    """nn.Linear, or (with a sum attached, under grad) one whose weight grad goes into it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self._buffers.get(SUM_BUFFER)
        if total is None or not torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        return _LinearIntoSum.apply(x, self.weight, self.bias, total)


def route_linears(module: nn.Module) -> None:
    """Make the module's nn.Linear layers SumLinear (in place; nothing else changes)."""
    for sub in module.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = SumLinear


def attach_sums(module: nn.Module, blocks: ModelBlocks, block: int,
                flat_sum: torch.Tensor) -> None:
    """Point each routed linear's weight grad at its slot of the block's flat fp32 sum."""
    slots = {slot.local_name: view for slot, view in blocks.views(block, flat_sum)}
    for name, sub in module.named_modules():
        if isinstance(sub, SumLinear):
            sub._buffers[SUM_BUFFER] = slots[f"{name}.weight"]


def detach_sums(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, SumLinear):
            sub._buffers.pop(SUM_BUFFER, None)
