"""Eval: the loss and next-token accuracy of the current weights on held-out batches.

A forward pass only, between segments (the pipeline drained), layer by layer over all the
eval batches at once: each block's bf16 weights go to the GPU once per eval (cast from the fp32
master weights, or where the block is updated on the GPU, as they are there), the eval batches'
hidden states stay on the GPU. It borrows the runner's first ring unit for the sliding layers:
every segment loads the weights it computes with, so nothing the next step needs is lost.

With several ranks each scores its share of the batches (every rank-th one) and the sums are
added over the ranks; every rank takes part in each block's gather of the host's slices.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from layerslide.executor.blocks import EMBEDDING
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """One eval: the mean token loss, the share of labels predicted exactly, and how many."""

    step: int  # optimizer steps taken before it
    loss: float
    accuracy: float
    tokens: int
    seconds: float  # wall time of the eval


def evaluate(runner, state, batches: list[tuple[torch.Tensor, ...]], step: int,
             chunk_tokens: int = 4096) -> EvalResult:
    """Loss and accuracy of the weights in `state` (and the runner's GPU-updated blocks) over
    `batches`, each (input_ids, labels[, position_ids]) as a TokenSource gives them."""
    dev = runner.device.device
    runner.device.synchronize()  # nothing of the last segment in flight
    start_s = time.perf_counter()
    batches = batches[runner.ranks.rank::runner.ranks.world]
    with torch.no_grad(), torch.cuda.device(dev) if dev.type == "cuda" else nullcontext():
        attention = [runner.document_attention(b[2]) if len(b) > 2 else None for b in batches]
        embedding = _weights(runner, state, EMBEDDING)
        hidden = [nn.functional.embedding(b[0].to(dev), embedding.view(runner.spec.vocab_size, -1))
                  for b in batches]
        for layer in range(runner.L):
            unit = _layer_unit(runner, state, layer)
            hidden = [runner.call_layer(unit.module, x, context)
                      for x, context in zip(hidden, attention, strict=True)]
        head = runner.dedicated[runner.L]
        _weights(runner, state, runner.L)
        if runner.blocks.tied:
            lm_weight = embedding.view(runner.spec.vocab_size, -1)
        else:
            lm_weight = head.flat[:runner.spec.vocab_size * runner.spec.hidden_size].view(
                runner.spec.vocab_size, -1)
        loss = torch.zeros((), dtype=torch.float64, device=dev)
        correct = torch.zeros((), dtype=torch.int64, device=dev)
        count = 0
        for x, batch in zip(hidden, batches, strict=True):
            normed = head.module["norm"](x).view(-1, x.shape[-1])
            labels = batch[1].to(dev).view(-1)
            for start in range(0, len(labels), chunk_tokens):
                part_loss, part_correct = _token_scores(
                    normed[start:start + chunk_tokens], lm_weight,
                    labels[start:start + chunk_tokens])
                loss += part_loss
                correct += part_correct
            count += int((batch[1] != IGNORE_INDEX).sum())
    runner.device.synchronize()
    loss, correct, count = _summed_over_ranks(runner.ranks, float(loss), int(correct), count)
    if count == 0:
        raise ValueError("the eval batches have no label to score")
    return EvalResult(step=step, loss=loss / count, accuracy=correct / count,
                      tokens=count, seconds=time.perf_counter() - start_s)


def _summed_over_ranks(ranks, loss: float, correct: int, count: int) -> tuple[float, int, int]:
    """Every rank's sums of its share of the batches added up (one rank: its own)."""
    if ranks.world == 1:
        return loss, correct, count
    sums = torch.tensor([loss, correct, count], dtype=torch.float64)
    dist.all_reduce(sums, group=ranks.group(None, "world"))
    return float(sums[0]), int(sums[1]), int(sums[2])


def _token_scores(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor):
    """Summed cross-entropy and correct argmax predictions of the labelled rows."""
    logits = (x @ weight.T).float()
    valid = labels != IGNORE_INDEX
    target = torch.where(valid, labels, 0)
    token_loss = torch.logsumexp(logits, dim=-1) - logits.gather(1, target[:, None]).squeeze(1)
    hits = (logits.argmax(dim=-1) == target) & valid
    return torch.where(valid, token_loss, 0.0).sum(dtype=torch.float64), hits.sum()


def _weights(runner, state, block: int) -> torch.Tensor:
    """The block's bf16 weights on the GPU: a GPU-updated block's own unit, else a unit of its
    own or the borrowed ring unit, filled from the fp32 master weights."""
    if block in runner.gpu_updated:
        return runner.dedicated[block].flat
    target = runner.dedicated[block] if block in runner.dedicated else runner.ring[0]
    master = state.owned_master(block)
    staged = torch.empty(master.numel(), dtype=torch.bfloat16,
                         pin_memory=runner.device.is_cuda)
    if state.native is not None:
        state.native.cast(master, staged)
    else:
        staged.copy_(master)
    # (synchronous from a fresh pinned buffer: it is reused next)
    runner.fill_unit(target, block, staged)
    return target.flat


def _layer_unit(runner, state, layer: int):
    """The unit decoder layer `layer` computes from, its weights in place."""
    _weights(runner, state, layer)
    return runner.dedicated.get(layer) or runner.ring[0]

