"""The LM head's linear + cross-entropy with a Triton kernel: the loss and its grads together.

The loss is the model's final output, so its grad w.r.t. the logits is known in the forward:
softmax - onehot(target), times the loss scale. Per chunk of rows, cuBLAS writes the logits in
x's dtype, and one Triton program per row finds the row's logsumexp (online max and sum-exp in
fp32), writes its loss, and overwrites the logits with their grad in place; two GEMMs then give
d_x and d_weight. Only one [chunk, vocab] buffer exists, 2 bytes per logit in bf16, where
`layerslide.executor.compute.chunked_linear_cross_entropy` holds ~10 (fp32 logits, exp, grad).

The kernel is decorated on first use, not at import: Triton reads TRITON_INTERPRET when it
decorates, and the CPU tests turn the interpreter on after other modules may have run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch

# labels the loss leaves out (Hugging Face's and PyTorch's convention)
IGNORE_INDEX = -100


try:
    import triton
    import triton.language as tl
except ImportError:  # triton is only installed on Linux x86_64 (see pyproject.toml)
    triton = None

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TORCH_PATH = "layerslide.executor.compute.chunked_linear_cross_entropy"


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """Vocab columns a program handles per step of its loops, and warps per program."""

    block: int
    num_warps: int

    @classmethod
    def for_vocab(cls, vocab: int, block: int | None = None) -> LaunchConfig:
        if block is not None and (block < 1 or block & (block - 1)):
            raise ValueError(f"block must be a power of two (tl.arange's rule), got {block}")
        # 8192 columns, 16 warps: 16 fp32 values per thread, few loop steps over a 128k vocab;
        # 64 registers a thread, no spills (ptxas, sm_90)
        block = block or min(8192, triton.next_power_of_2(max(vocab, 16)))
        return cls(block=block, num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_head_available(device: torch.device) -> bool:
    """Whether `fused_linear_cross_entropy` runs on `device`: CUDA with Triton, or the CPU
    under Triton's interpreter (TRITON_INTERPRET=1, for tests)."""
    if triton is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and _interpreting())


def _maximum(a, b):
    return tl.maximum(a, b)


def _add(a, b):
    return a + b


if triton is not None:
    # tl.reduce with these, not tl.max / tl.sum: those are @jit functions decorated when
    # triton.language is imported, and the interpreter cannot call them if that was before
    # TRITON_INTERPRET was set; it calls a combine function's Python body whichever it is.
    _maximum, _add = triton.jit(_maximum), triton.jit(_add)


def _row_loss_and_grad(logits_ptr, logits_row_stride, labels_ptr, labels_stride, loss_ptr,
                       scale_ptr, ignore_index, VOCAB: tl.constexpr, BLOCK: tl.constexpr):
    # int64: chunk * vocab offsets pass 2^31 at real sizes (65536 x 151936)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride
    label = tl.load(labels_ptr + row * labels_stride)
    valid = label != ignore_index
    in_range = (label >= 0) & (label < VOCAB)
    target = tl.where(in_range, label, 0)
    cols = tl.arange(0, BLOCK)
    # Pass 1, a running max and sum-exp per lane, reduced once at the end (the loop has no
    # cross-warp reductions). Ignored rows load nothing (masked loads move no bytes), as prompt
    # tokens can be most of a batch. A finite start, not -inf, keeps max - max from being NaN
    # in lanes that never load.
    read_to = tl.where(valid, VOCAB, 0)  # not valid & mask: the interpreter makes that int64
    lane_max = tl.full([BLOCK], -3.0e38, tl.float32)
    lane_sum = tl.full([BLOCK], 0.0, tl.float32)  # tl.full: tl.zeros is @jit (see _add)
    for start in range(0, VOCAB, BLOCK):
        offs = start + cols
        v = tl.load(row_ptr + offs, mask=offs < read_to, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, v)
        lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.exp(v - new_max)
        lane_max = new_max
    row_max = tl.reduce(lane_max, 0, _maximum)
    sum_exp = tl.reduce(lane_sum * tl.exp(lane_max - row_max), 0, _add)
    # ignored rows have sum_exp = 0: lse = 0, not -inf, keeps their pass 2 finite
    lse = tl.where(valid, row_max + tl.log(tl.where(valid, sum_exp, 1.0)), 0.0)
    target_logit = tl.load(row_ptr + target).to(tl.float32)
    # an out-of-range label gives NaN loss and grads (seen, and the step skipped), with no sync
    loss = tl.where(in_range, lse - target_logit, float("nan"))
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    scale = tl.load(scale_ptr).to(tl.float32)
    bad = tl.where(valid & ~in_range, float("nan"), 0.0)
    for start in range(0, VOCAB, BLOCK):
        offs = start + cols
        v = tl.load(row_ptr + offs, mask=offs < read_to, other=0.0).to(tl.float32)
        p = tl.exp(v - lse) - tl.where(offs == target, 1.0, 0.0)
        grad = tl.where(valid, p * scale + bad, 0.0)
        tl.store(row_ptr + offs, grad.to(logits_ptr.dtype.element_ty), mask=offs < VOCAB)


@cache
def _kernel(interpreting: bool):
    del interpreting  # the cache key: triton.jit reads TRITON_INTERPRET itself
    return triton.jit(_row_loss_and_grad)


def _validate(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
              scale: torch.Tensor, chunk_tokens: int) -> None:
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden] and weight [vocab, hidden]; got shapes "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}: flatten batch and sequence")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has hidden size {x.shape[1]} but weight has {weight.shape[1]}")
    if labels.dim() != 1 or labels.shape[0] != x.shape[0]:
        raise ValueError(f"labels must be 1-D with one label per row of x ({x.shape[0]}); "
                         f"got shape {tuple(labels.shape)}")
    if labels.dtype != torch.int64:
        raise ValueError(f"labels must be int64, got {labels.dtype}: use labels.long()")
    if x.dtype != weight.dtype or x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x and weight must share one of {FLOAT_DTYPES}; got {x.dtype} and "
                         f"{weight.dtype}: cast them, or use {TORCH_PATH} for other dtypes")
    if scale.numel() != 1 or scale.dim() != 0:
        raise ValueError(f"scale must be a 0-dim tensor, got shape {tuple(scale.shape)}")
    if int(chunk_tokens) < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    devices = {t.device for t in (x, weight, labels, scale)}
    if len(devices) != 1:
        raise ValueError(f"x, weight, labels and scale must be on one device, got {devices}")
    if not triton_head_available(x.device):
        raise ValueError(f"the Triton head needs a CUDA device with Triton installed, or "
                         f"TRITON_INTERPRET=1 on the CPU (tests); on {x.device} use {TORCH_PATH}")


def fused_linear_cross_entropy(
        x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor,
        chunk_tokens: int, *, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum of token losses of logits = x @ weight.T (fp32, 0-dim), with the grads of
    (loss * scale) w.r.t. x and weight in their dtype; labels of IGNORE_INDEX count for
    nothing. A drop-in for chunked_linear_cross_entropy; `block` overrides the vocab block."""
    _validate(x, weight, labels, scale, chunk_tokens)
    tokens, vocab = x.shape[0], weight.shape[0]
    chunk = min(int(chunk_tokens), max(tokens, 1))
    config = LaunchConfig.for_vocab(vocab, block)
    kernel = _kernel(_interpreting())
    row_losses = torch.empty(tokens, dtype=torch.float32, device=x.device)
    d_x = torch.empty((tokens, x.shape[1]), dtype=x.dtype, device=x.device)
    d_weight = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    # one buffer reused by every chunk: the allocator's cache would not fragment, but out= is
    # explicit about the only [chunk, vocab] tensor there is
    logits_buffer = torch.empty((chunk, vocab), dtype=x.dtype, device=x.device)
    for start in range(0, tokens, chunk):
        rows = slice(start, min(start + chunk, tokens))
        xc, yc = x[rows], labels[rows]
        logits = logits_buffer[: xc.shape[0]]
        torch.mm(xc, weight.T, out=logits)
        kernel[(xc.shape[0],)](logits, logits.stride(0), yc, yc.stride(0), row_losses[rows],
                               scale, IGNORE_INDEX, VOCAB=vocab, BLOCK=config.block,
                               num_warps=config.num_warps)
        torch.mm(logits, weight, out=d_x[rows])
        d_weight.addmm_(logits.T, xc)
    return row_losses.sum(), d_x, d_weight
