"""Plain PyTorch mixed-precision AdamW training: the reference the executor must reproduce.

fp32 master weights; each step a bf16 copy of the whole Hugging Face model computes every
micro-batch's loss (mean over its tokens, divided by the accumulation count) with ordinary
autograd; the bf16 grads are summed in fp32, the global norm is clipped, and torch's fused AdamW
(decoupled weight decay on matrices only) updates the master weights with the warmup + cosine
schedule. A step whose gradients are not finite is skipped.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig


class ReferenceTrainer:
    def __init__(self, config: PretrainedConfig, master: dict[str, torch.Tensor], *, lr_at,
                 betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_accum=1,
                 max_grad_norm=None):
        config = config.__class__.from_dict(config.to_dict())
        config._attn_implementation = "sdpa"
        self.model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        self.names = [n for n, _ in self.model.named_parameters()]
        self.master = {n: master[n].clone().float() for n in self.names}
        self.params = {n: nn.Parameter(t) for n, t in self.master.items()}
        groups = [
            {"params": [p for n, p in self.params.items() if p.ndim >= 2],
             "weight_decay": weight_decay},
            {"params": [p for n, p in self.params.items() if p.ndim < 2], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1.0, betas=betas,
                                     eps=eps, fused=True)
        self.lr_at, self.grad_accum, self.max_grad_norm = lr_at, grad_accum, max_grad_norm
        self.step_count = 0

    def grad_sums(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """fp32 sums of the micro-batches' bf16 grads at the current weights (no update)."""
        return self._forward_backward(batches)[0]

    def _forward_backward(self, batches) -> tuple[dict[str, torch.Tensor], float]:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.params[n])
        sums = {n: torch.zeros_like(p) for n, p in self.params.items()}
        total_loss = 0.0
        for ids, labels, *positions in batches:
            self.model.zero_grad(set_to_none=True)
            logits = (self._logits_by_document(ids, positions[0]) if positions
                      else self.model(input_ids=ids).logits.float())
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                               labels.view(-1), ignore_index=-100)
            (loss / self.grad_accum).backward()
            total_loss += loss.detach().item() / self.grad_accum
            for n, p in self.model.named_parameters():
                sums[n] += p.grad.float()
        return sums, total_loss

    def _logits_by_document(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed rows (positions restart at each document): every document run alone, as a
        sequence of its own, and the logits put back in the row's order."""
        rows = []
        for row_ids, row_positions in zip(ids, positions, strict=True):
            starts = [*(row_positions == 0).nonzero().flatten().tolist(), len(row_ids)]
            rows.append(torch.cat([self.model(input_ids=row_ids[None, a:b]).logits[0].float()
                                   for a, b in pairwise(starts)]))
        return torch.stack(rows)

    def step(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, bool]:
        """One optimizer step over grad_accum micro-batches: (loss, skipped)."""
        sums, total_loss = self._forward_backward(batches)
        norm = math.sqrt(sum(float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2
                             for g in sums.values()))
        skipped = not math.isfinite(norm)
        if not skipped:
            coef = 1.0
            if self.max_grad_norm is not None:
                coef = min(1.0, self.max_grad_norm / (norm + 1e-6))
            for n, p in self.params.items():
                p.grad = sums[n] * coef
            for group in self.opt.param_groups:
                group["lr"] = self.lr_at(self.step_count)
            self.opt.step()
        self.step_count += 1
        return total_loss, skipped
