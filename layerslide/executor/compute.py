"""The GPU computations of one task: an HF decoder layer, and the head's chunked loss."""

from __future__ import annotations

import torch
from torch import nn

IGNORE_INDEX = -100


def call_layer(module: nn.Module, x: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One HF decoder layer on [batch, seq, hidden]: causal SDPA attention (no mask tensor)."""
    out = module(x, attention_mask=None, position_embeddings=rope)
    return out[0] if isinstance(out, tuple) else out  # transformers < 4.54 returns a tuple


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
