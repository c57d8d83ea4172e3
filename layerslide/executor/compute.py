"""The GPU computations of one task: an HF decoder layer, the head's chunked loss, and the
embedding's grad added into a tied head's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX
from layerslide.planner.settings import LAYER_KERNEL_MODES

LayerCall = Callable[..., torch.Tensor]


def call_layer(module: nn.Module, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """One HF decoder layer on [batch, seq, hidden]: causal SDPA attention (no mask tensor),
    or SDPA under `mask` ([batch, 1, seq, seq] bool, True where a token may attend)."""
    out = module(x, attention_mask=mask, position_embeddings=rope)
    return out[0] if isinstance(out, tuple) else out  # transformers < 4.54 returns a tuple


def layer_call(kernels: str, device: torch.device, *, backend: str = "inductor") -> LayerCall:
    """How the runner calls decoder layers. "compiled": through torch.compile, whose Inductor
    fuses RMSNorm, RoPE, SwiGLU and the residual adds into Triton kernels and saves fewer
    tensors for the backward (on the H200, a Llama-3.2-3B layer's forward + recompute + backward
    at 64k tokens: 90.5 ms against 120.6 eager, 7.6 GiB peak against 11.4;
    benchmarks/results/archive/layer_kernels_2026-11-29). One graph serves every cache unit: the
    modules differ only in the parameters Dynamo takes as inputs. On the CPU device (a test
    mode) layers run eager: Inductor's CPU kernels would only cost compile time there."""
    if kernels not in LAYER_KERNEL_MODES:
        raise ValueError(f"layer kernels {kernels!r}: choose one of "
                         f"{', '.join(LAYER_KERNEL_MODES)}")
    if kernels == "eager" or (device.type != "cuda" and backend == "inductor"):
        return call_layer
    # static shapes: a run calls every layer with one [micro_batch, seq, hidden] shape
    return torch.compile(call_layer, backend=backend, dynamic=False)


def chunked_linear_cross_entropy(
        x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor,
        chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum of token losses of logits = x @ weight.T, with the grads of (loss * scale) w.r.t.
    x and weight, chunk by chunk so that only [chunk_tokens, vocab] logits exist at once."""
    loss = torch.zeros((), dtype=torch.float32, device=x.device)
    d_x = torch.empty_like(x)
    # bf16, as liger-kernel's: an fp32 sum would add 4 B per head parameter of GPU memory
    d_weight = torch.zeros_like(weight)
    for start in range(0, x.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        xc, yc = x[rows], labels[rows]
        logits = (xc @ weight.T).float()
        valid = yc != IGNORE_INDEX
        target = torch.where(valid, yc, 0)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, target[:, None]).squeeze(1)
        loss += torch.where(valid, lse - picked, 0.0).sum()
        # d(loss)/d(logits) = softmax - onehot, for the valid rows, times the loss scale
        grad = torch.exp(logits - lse[:, None])
        grad[torch.arange(len(yc), device=x.device), target] -= 1.0
        grad *= (valid.float() * scale)[:, None]
        grad = grad.to(x.dtype)
        d_x[rows] = grad @ weight
        d_weight.addmm_(grad.T, xc)
    return loss, d_x, d_weight


def add_embedding_grad(weight_grad: torch.Tensor, dgrad: torch.Tensor,
                       ids: torch.Tensor) -> torch.Tensor:
    """weight_grad (a [V, h] grad) plus the embedding lookup's grad for `ids`, in place, without
    making the dense [V, h] embedding grad: the rows of each distinct id are summed by the same
    embedding_dense_backward call shape as the dense grad's (min(tokens, V) weights, so torch
    picks the same kernel) into a slot of their own, and each slot is added to its id's row.
    Slots no id fills are zero rows added to row 0. Equal values to the dense grad added (a
    zero's sign can differ). Fixed shapes throughout: no sync with the GPU, which would stall
    the lane that enqueues its work."""
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot_sorted = torch.cumsum(starts, 0) - 1  # each token's slot: its id's rank among them
    slot = torch.empty_like(slot_sorted).scatter_(0, order, slot_sorted)
    slots = min(flat.numel(), weight_grad.shape[0])
    rows = torch.ops.aten.embedding_dense_backward(
        dgrad.reshape(-1, dgrad.shape[-1]), slot, slots, -1, False)
    slot_ids = torch.zeros(slots, dtype=flat.dtype, device=flat.device)
    slot_ids.scatter_(0, slot_sorted, sorted_ids)  # each filled slot's id (all writers agree)
    # (a layer-major sweep adds them into its fp32 sum: rows rounded to bf16 as alone)
    return weight_grad.index_add_(0, slot_ids, rows.to(weight_grad.dtype))
