"""Memory and work sizes of the plan's tasks and buffers, in one place (bytes, FLOPs, launches).

Numbers marked "estimate" are first-order models of what PyTorch does; the calibration issue
replaces them with measured ones. Everything here is per block and per micro-batch.
"""

from __future__ import annotations

import math

from layerslide.planner.model import BF16_BYTES, FP32_BYTES, ModelSpec
from layerslide.planner.settings import (
    HEAD_CHUNK_LOGIT_BYTES,
    MOMENT_BLOCK_ELEMENTS,
    MomentPrecision,
    moments_nbytes,
)

GIB = 1024**3

# cuBLAS's workspace per thread and stream, taken from the caching allocator at the thread's
# first GEMM on the stream and kept (PyTorch's default on Hopper; 8 MiB or less on older
# GPUs): the compute lane's thread and autograd's each take one on the compute stream.
BLAS_WORKSPACE_BYTES = 32 * 2**20
BLAS_WORKSPACES = 2
# estimate: CUDA context, cuDNN workspaces and allocator slack that every run pays (0.75 GiB
# with cuBLAS's workspaces, which are buffers of the plan's own now)
GPU_RUNTIME_BYTES = int(0.75 * GIB) - BLAS_WORKSPACES * BLAS_WORKSPACE_BYTES
# estimate: resident set of a Python process with torch and the CUDA libraries loaded.
HOST_RUNTIME_BYTES = int(2 * GIB)

# AdamW needs fp32 grads: reading bf16 grads (2 B) and writing fp32 (4 B) adds to its traffic.
GRAD_UPCAST_BYTES_PER_PARAM = BF16_BYTES + FP32_BYTES


def cpu_optimizer_extra_bytes_per_param(cpu_optimizer: str, reads_bf16: bool,
                                        writes_bf16: bool,
                                        moment_precision: MomentPrecision = "fp32") -> float:
    """Host bytes per parameter of a CPU optimizer step beyond the profile's AdamW traffic
    (which reads fp32 grads and moments); negative: fewer. reads_bf16: it steps on the landed
    bf16 grads, not on the host's fp32 sums. torch: an upcast pass for bf16 grads. native: one
    pass that reads bf16 grads (2 B less) or the fp32 sums, may write the bf16 weights, and
    reads and writes the moments in their precision."""
    if cpu_optimizer == "torch":
        return GRAD_UPCAST_BYTES_PER_PARAM if reads_bf16 else 0
    native = max(0, (BF16_BYTES if writes_bf16 else 0) - (BF16_BYTES if reads_bf16 else 0))
    return native - 2 * (MOMENTS_BYTES_PER_PARAM - moment_bytes_per_param(moment_precision))


def moment_bytes_per_param(precision: MomentPrecision) -> float:
    """Bytes per parameter of AdamW's m and v in a precision (8-bit: with their scales)."""
    return moments_nbytes(MOMENT_BLOCK_ELEMENTS, precision) / MOMENT_BLOCK_ELEMENTS


# Fused AdamW on the GPU: read fp32 grad, param, m, v; write param, m, v and the bf16 weights.
GPU_ADAMW_BYTES_PER_PARAM = 4 * FP32_BYTES + 3 * FP32_BYTES + BF16_BYTES
GPU_ADAMW_OPS = 4
# Compact moments on the GPU take torch ops, not a fused kernel (executor/moments.py): estimate
# of their HBM traffic (~15 elementwise passes over fp32 temporaries) and launches per slice
# of moments.TORCH_STEP_SLICE elements.
GPU_COMPACT_ADAMW_BYTES_PER_PARAM = 120
GPU_COMPACT_ADAMW_OPS_PER_SLICE = 40
GPU_COMPACT_ADAMW_SLICE = 1 << 22
# The ledger's rates, bytes per parameter of the state buffers: the plan's static buffers are
# sized by them (build.static_buffers), tune, what-if and `layerslide models` bound capacity
# by them, and the executor's allocations are held equal to the plan's (tests/executor/
# test_ledger.py). The moments' rate depends on their precision (moment_bytes_per_param).
MASTER_BYTES_PER_PARAM = FP32_BYTES  # fp32 master weights, in RAM or on NVMe
MOMENTS_BYTES_PER_PARAM = 2 * FP32_BYTES  # AdamW m and v in fp32, in RAM or on NVMe
UPLOAD_BYTES_PER_PARAM = BF16_BYTES  # the bf16 copy loads read (cast=cpu_once), RAM or NVMe
HOST_STATE_BYTES_PER_PARAM = (MASTER_BYTES_PER_PARAM + MOMENTS_BYTES_PER_PARAM
                              + UPLOAD_BYTES_PER_PARAM)


def host_state_bytes_per_param(precision: MomentPrecision = "fp32") -> float:
    """Master weights, moments in their precision and the bf16 upload copy, per parameter."""
    return MASTER_BYTES_PER_PARAM + moment_bytes_per_param(precision) + UPLOAD_BYTES_PER_PARAM


def gpu_updated_state_bytes_per_param(precision: MomentPrecision = "fp32") -> float:
    """A GPU-updated block's fp32 master weights and grad sums, and its moments."""
    return 2 * FP32_BYTES + moment_bytes_per_param(precision)


def gpu_updated_bytes_per_param(precision: MomentPrecision = "fp32") -> float:
    """That state and the block's bf16 weights."""
    return BF16_BYTES + gpu_updated_state_bytes_per_param(precision)


def gpu_adamw_cost(params: int, precision: MomentPrecision) -> tuple[float, int]:
    """(HBM bytes, launches) of a GPU-updated block's AdamW step."""
    if precision == "fp32":
        return GPU_ADAMW_BYTES_PER_PARAM * params, GPU_ADAMW_OPS
    slices = -(-params // GPU_COMPACT_ADAMW_SLICE)
    return GPU_COMPACT_ADAMW_BYTES_PER_PARAM * params, GPU_COMPACT_ADAMW_OPS_PER_SLICE * slices


# Gradient accumulation on the host: read bf16 grads, read and write the fp32 sum.
ACCUMULATE_BYTES_PER_PARAM = BF16_BYTES + 2 * FP32_BYTES
# On the GPU (layer-major): the same add into the fp32 sum, then the sum rounded to bf16 once
# for the offload (read fp32, write bf16).
GPU_GRAD_SUM_BYTES_PER_PARAM = ACCUMULATE_BYTES_PER_PARAM
# A decoder layer's projection weights skip that add: their weight-grad GEMMs read and write
# the fp32 sum themselves (8 B), most of it under the GEMM's math; charged as the HBM bytes of
# the time it adds (benchmarks/results/archive/lm_gap_2026-12-02, grad_sum_probe at 4k tokens).
GPU_GRAD_INTO_SUM_BYTES_PER_PARAM = 5
GPU_GRAD_ROUND_BYTES_PER_PARAM = FP32_BYTES + BF16_BYTES

# Host-side op dispatches of one compiled Hugging Face decoder layer, in tiny-kernel launches
# (the profile's gpu.kernel_launch): the host time to enqueue a pass from an idle queue over
# the launch price measured in the same process, on the H200 machine for Llama-3.2-3B, Qwen3-4B
# and Mistral-7B at 64-4096 tokens, the median of 13 (benchmarks/results/
# validation_2026-12-03b, layer_dispatch.json). Recompute + backward is ~5x the forward.
LAYER_FORWARD_OPS = 75
LAYER_BACKWARD_OPS = 375  # recompute forward + backward
HEAD_OPS = 30


def layer_matmul_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs of one decoder layer per token (q, k, v, o, gate, up, down)."""
    return 2.0 * model.layer_matmul_params


def attention_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward attention FLOPs per token, counted non-causal (QK^T and AV: 4*s*heads*head_dim)."""
    return model.layer_forward_flops_per_token(seq_len) - layer_matmul_flops_per_token(model)


def layer_elementwise_bytes_per_token(model: ModelSpec, layer_kernels: str) -> int:
    """HBM bytes per token that a layer's forward moves outside GEMMs and attention."""
    h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
    attention_layout = 4 * q  # attention output transpose(1, 2).contiguous(): r2 w2
    if layer_kernels == "compiled":
        # Inductor fuses each chain into one kernel: residual add + RMSNorm (r2 r2 w2 w2, twice),
        # RoPE on q and k (r2 w2), silu(gate) * up (r2 r2 w2)
        return 2 * 8 * h + 4 * (q + kv) + 6 * f + attention_layout
    # Hugging Face's modules, unfused. RMSNorm: to fp32 (r2 w4), pow (r4 w4), mean (r4),
    # * rsqrt (r4 w4), to bf16 (r4 w2), * weight (r2 w2) = 36 B per element, twice per layer.
    norms = 2 * 36 * h
    # RoPE on q and k: q*cos, rotate_half (neg + cat), *sin, add: ~20 B per element.
    rope = 20 * (q + kv)
    swiglu = 10 * f  # silu(gate): r2 w2; * up: r2 r2 w2
    residuals = 2 * 6 * h  # two adds: r2 r2 w2
    return norms + rope + swiglu + residuals + attention_layout


def layer_saved_bytes_per_token(model: ModelSpec, layer_kernels: str) -> int:
    """Bytes per token a layer's recompute saves for its backward (ModelSpec's list for HF's
    eager modules). Compiled, the min-cut partitioner keeps the GEMM and attention inputs and
    outputs and recomputes the cheap elementwise results (norms, RoPE, silu(gate) * up) in the
    backward: 2h + 2q + 2kv + 2f bf16 values plus the attention's fp32 logsumexp. On the H200, a
    Llama-3.2-3B layer at 64k tokens peaked at 7.6 GiB compiled, 11.4 eager
    (benchmarks/results/archive/layer_kernels_2026-11-29)."""
    if layer_kernels == "compiled":
        h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
        return BF16_BYTES * (2 * h + 2 * q + 2 * kv + 2 * f) + FP32_BYTES * (
            2 + model.num_attention_heads)
    return model.layer_activation_bytes_per_token


def forward_workspace_bytes(model: ModelSpec, tokens: int) -> int:
    """Transient GPU bytes of one layer's forward without autograd: the FFN's gate, up and act."""
    return BF16_BYTES * 3 * model.intermediate_size * tokens


def backward_workspace_bytes(model: ModelSpec, tokens: int, layer_kernels: str) -> int:
    """Transient GPU bytes of one layer's recompute + backward: saved tensors and their grads."""
    saved = layer_saved_bytes_per_token(model, layer_kernels) * tokens
    return saved + forward_workspace_bytes(model, tokens)




def hidden_bytes(model: ModelSpec, tokens: int) -> int:
    """One [tokens, hidden] bf16 tensor: a checkpoint or the gradient flowing between layers."""
    return model.layer_checkpoint_bytes_per_token * tokens


def fused_head_chunk_tokens(model: ModelSpec, tokens: int,
                            chunk_bytes: int = HEAD_CHUNK_LOGIT_BYTES) -> int:
    """Rows per chunk of the fused linear cross-entropy: as many as keep one chunk's bf16 logits
    within chunk_bytes (a power of two, at least 256), so that the head's three GEMMs see
    thousands of rows rather than hundreds."""
    rows = chunk_bytes // (BF16_BYTES * model.vocab_size)
    return min(tokens, max(256, 2 ** int(math.log2(max(1, rows)))))


# The final RMSNorm runs under autograd in HF's fp32 form and keeps for its backward its input
# upcast to fp32, the normalised fp32 values and their bf16 cast: 10 B per hidden element. H200:
# the head's measured peak ran 0.16 GiB above the plan without it at 1B micro-batch 8 (8k x 2048
# elements: 0.16 GiB) and 0.13 at 3B micro-batch 4 (4k x 3072: 0.12 GiB)
# (benchmarks/results/archive/validation_2026-11-30c).
FINAL_NORM_SAVED_BYTES_PER_ELEMENT = 2 * FP32_BYTES + BF16_BYTES


def final_norm_saved_bytes(model: ModelSpec, tokens: int) -> int:
    """GPU bytes the head's final norm keeps for its backward (made before its loss's)."""
    return FINAL_NORM_SAVED_BYTES_PER_ELEMENT * model.hidden_size * tokens


def head_loss_workspace_bytes(model: ModelSpec, tokens: int, head_loss: str,
                              chunk_bytes: int = HEAD_CHUNK_LOGIT_BYTES) -> int:
    """Transient GPU bytes of the LM head and cross-entropy, forward and backward."""
    if head_loss == "materialized":
        # bf16 logits, their fp32 upcast for the loss, and the fp32 grad of the logits.
        return (BF16_BYTES + 2 * FP32_BYTES) * model.vocab_size * tokens
    # one chunk's bf16 logits, overwritten by their grad in place, and its rows' fp32 losses
    chunk = fused_head_chunk_tokens(model, tokens, chunk_bytes)
    return (BF16_BYTES * model.vocab_size + FP32_BYTES) * chunk


def head_logit_bytes(model: ModelSpec, tokens: int, head_loss: str) -> int:
    """HBM traffic of the logits in the head's loss, forward and backward (estimate)."""
    # materialised: write bf16 logits, upcast to fp32 (r2 w4), softmax/loss (r4), grad (w4),
    # downcast for the GEMMs (r4 w2) ~ 20 B per logit. Fused: bf16 logits written by the GEMM
    # (w2), read for the logsumexp (r2), rewritten as their grad (r2 w2), read by the two
    # backward GEMMs (r4) = 12 B per logit.
    per_logit = 20 if head_loss == "materialized" else 12
    return per_logit * model.vocab_size * tokens


def head_params(model: ModelSpec) -> int:
    """Parameters updated as the head block: final norm, and the LM head when not tied."""
    return model.head_params + model.final_norm_params
