"""The Triton linear cross-entropy against PyTorch autograd and the executor's chunked path.

Without a CUDA GPU the kernel runs under Triton's interpreter (conftest.py), so CPU shapes are
tiny; with one, the same tests run compiled, and the `gpu` tests add real head shapes.

Tolerances. fp32 inputs: the kernel's arithmetic is fp32, compared with a float64 reference, so
fp32 rounding (~1e-7 relative per op, over sums of <= 513 terms). bf16 inputs: the logits are
written in bf16 (relative error <= 2^-9) and so are their grads, so
- the loss: d(loss_row)/d(logits) = softmax - onehot has an L1 norm <= 2, so each valid row's
  loss moves by at most 2 * 2^-9 * max|logit| of the row; the test sums that bound.
- the grads: each element is a GEMM over bf16 grads rounded once more to bf16, and d_weight is
  summed over chunks in bf16: a few 2^-9 relative in norm. The bound is 2^-5 (3%), while a
  missing scale, onehot or chunk is off by O(1) (100% or more).
Against the chunked PyTorch path, which rounds the same bf16 logits with the same GEMMs, the
only difference is how the fp32 grads of the logits round to bf16: 2^-7. (Triton's interpreter
truncates fp32 -> bf16 where the GPU rounds to nearest, so on the CPU the two differ by ~0.4%
in norm, and by ~1e-7 for fp32 inputs.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from layerslide.executor.compute import IGNORE_INDEX, chunked_linear_cross_entropy
from layerslide.kernels.linear_cross_entropy import (
    LaunchConfig,
    fused_linear_cross_entropy,
    triton_head_available,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16_EPS = 2.0**-9  # unit roundoff of bf16 (8 significant bits)


def make_inputs(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, ignore: str = "some",
                seed: int = 0, device: str = DEVICE):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    weight = torch.randn(vocab, hidden, generator=gen) * (2.0 / hidden**0.5)  # logits ~ N(0, 4)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    if ignore == "some":
        labels[1::3] = IGNORE_INDEX
    elif ignore == "all":
        labels[:] = IGNORE_INDEX
    valid = max(1, int((labels != IGNORE_INDEX).sum()))
    scale = torch.tensor(1.0 / valid / 3.0)  # a loss mean over tokens, over 3 micro-batches
    return (x.to(device, dtype), weight.to(device, dtype), labels.to(device),
            scale.to(device))


def reference(x, weight, labels, scale):
    """Materialised float64 logits, PyTorch's cross-entropy and autograd."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    loss = F.cross_entropy(x64 @ w64.T, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    (loss * scale.double()).backward()
    return loss.detach(), x64.grad, w64.grad


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


def bf16_loss_bound(x, weight, labels) -> float:
    """2 * 2^-9 * max|logit| summed over valid rows, + fp32 slack; by 1024 rows, as the GPU
    tests' logits would not fit twice."""
    row_max = torch.cat([(xc.float() @ weight.float().T).abs().amax(dim=1)
                         for xc in x.split(1024)]) if len(x) else x.new_zeros(0)
    return float(2 * BF16_EPS * row_max[labels != IGNORE_INDEX].double().sum()) + 1e-3


SHAPES = [  # tokens, hidden, vocab, chunk_tokens, block (None: the launcher's choice)
    (1, 8, 17, 1, 16),  # vocab 17: a full block and a 1-column tail
    (7, 32, 100, 3, 32),  # chunks of 3, 3, 1; vocab 100 = 3 blocks + 4
    (7, 8, 100, 100, 64),  # one chunk larger than the tokens
    (64, 32, 513, 16, 128),  # 513 = 4 blocks + 1
    (7, 8, 513, 4, None),  # the launcher's block: 1024 columns, half masked
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "hidden", "vocab", "chunk", "block"), SHAPES)
def test_matches_autograd(tokens, hidden, vocab, chunk, block, dtype):
    x, weight, labels, scale = make_inputs(tokens, hidden, vocab, dtype)
    loss, d_x, d_weight = fused_linear_cross_entropy(x, weight, labels, scale, chunk,
                                                     block=block)
    ref_loss, ref_dx, ref_dw = reference(x, weight, labels, scale)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert d_x.dtype == dtype and d_weight.dtype == dtype
    assert d_x.shape == x.shape and d_weight.shape == weight.shape
    if dtype == torch.float32:
        torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(d_x.double(), ref_dx, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(d_weight.double(), ref_dw, rtol=1e-4, atol=1e-6)
    else:
        assert abs(float(loss) - float(ref_loss)) <= bf16_loss_bound(x, weight, labels)
        assert relative_error(d_x, ref_dx) < 2.0**-5
        assert relative_error(d_weight, ref_dw) < 2.0**-5
    ignored = labels == IGNORE_INDEX
    assert torch.all(d_x[ignored] == 0)  # ignored tokens get no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_ignored_rows_give_zero_loss_and_grads(dtype):
    x, weight, labels, scale = make_inputs(7, 8, 100, dtype, ignore="all")
    loss, d_x, d_weight = fused_linear_cross_entropy(x, weight, labels, scale, 3, block=32)
    assert float(loss) == 0.0
    assert torch.all(d_x == 0) and torch.all(d_weight == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grads_are_scaled(dtype):
    """The grads carry the scale (a tensor), the loss does not."""
    x, weight, labels, _ = make_inputs(7, 32, 100, dtype, ignore="none")
    one = torch.tensor(1.0, device=DEVICE)
    loss_1, dx_1, dw_1 = fused_linear_cross_entropy(x, weight, labels, one, 4, block=32)
    loss_s, dx_s, dw_s = fused_linear_cross_entropy(x, weight, labels, one * 0.25, 4, block=32)
    assert float(loss_1) == float(loss_s) > 0
    # a power of two scales exactly, in bf16 too
    torch.testing.assert_close(dx_s, dx_1 * 0.25, rtol=0, atol=0)
    torch.testing.assert_close(dw_s, dw_1 * 0.25, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_agrees_with_the_pytorch_chunked_path(dtype, chunk):
    x, weight, labels, scale = make_inputs(64, 32, 513, dtype, seed=3)
    ours = fused_linear_cross_entropy(x, weight, labels, scale, chunk, block=64)
    theirs = chunked_linear_cross_entropy(x, weight, labels, scale, chunk)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-4)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-7
    assert relative_error(ours[1], theirs[1]) < tol
    assert relative_error(ours[2], theirs[2]) < tol


def test_strided_inputs():
    """Rows of x, labels and the weight need not be contiguous."""
    x, weight, labels, scale = make_inputs(16, 32, 100, torch.float32)
    x_wide = torch.cat([x, torch.zeros_like(x)], dim=1)[:, :32]  # row stride 64
    labels_spread = torch.stack([labels, labels * 0 + 5], dim=1)[:, 0]  # stride 2
    weight_t = weight.T.contiguous().T  # column-major
    assert x_wide.stride(0) == 64 and labels_spread.stride(0) == 2 and weight_t.stride(0) == 1
    loss, d_x, d_weight = fused_linear_cross_entropy(x_wide, weight_t, labels_spread, scale, 5,
                                                     block=32)
    ref_loss, ref_dx, ref_dw = reference(x, weight, labels, scale)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d_x.double(), ref_dx, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(d_weight.double(), ref_dw, rtol=1e-4, atol=1e-6)


def test_an_out_of_range_label_gives_nan_without_a_sync():
    x, weight, labels, scale = make_inputs(7, 8, 17, torch.float32, ignore="none")
    labels[2] = 17
    loss, d_x, _ = fused_linear_cross_entropy(x, weight, labels, scale, 4, block=16)
    assert torch.isnan(loss)
    assert torch.isnan(d_x[2]).all() and torch.isfinite(d_x[[0, 1, 3, 4, 5, 6]]).all()


def test_no_tokens():
    x, weight, labels, scale = make_inputs(0, 8, 17, torch.float32)
    loss, d_x, d_weight = fused_linear_cross_entropy(x, weight, labels, scale, 4)
    assert float(loss) == 0.0 and d_x.shape == (0, 8) and torch.all(d_weight == 0)


def _bad(kind: str):
    x, weight, labels, scale = make_inputs(4, 8, 17, torch.float32, ignore="none")
    args = {"x": x, "weight": weight, "labels": labels, "scale": scale, "chunk_tokens": 2}
    changes = {
        "x 3-D": {"x": x[None]},
        "hidden differs": {"weight": weight[:, :4]},
        "labels 2-D": {"labels": labels[None]},
        "labels short": {"labels": labels[:3]},
        "labels int32": {"labels": labels.int()},
        "dtypes differ": {"weight": weight.bfloat16()},
        "float64": {"x": x.double(), "weight": weight.double()},
        "scale not 0-dim": {"scale": scale[None]},
        "chunk 0": {"chunk_tokens": 0},
    }
    return {**args, **changes[kind]}


@pytest.mark.parametrize(("kind", "message"), [
    ("x 3-D", "flatten batch"), ("hidden differs", "hidden size 8 but weight has 4"),
    ("labels 2-D", "labels must be 1-D"), ("labels short", "one label per row of x"),
    ("labels int32", "labels.long()"), ("dtypes differ", "must share one of"),
    ("float64", "chunked_linear_cross_entropy"), ("scale not 0-dim", "0-dim"),
    ("chunk 0", "chunk_tokens must be >= 1")])
def test_bad_inputs_say_what_to_change(kind, message):
    with pytest.raises(ValueError, match=message):
        fused_linear_cross_entropy(**_bad(kind))


def test_cpu_needs_the_interpreter(monkeypatch):
    x, weight, labels, scale = make_inputs(4, 8, 17, torch.float32, device="cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_head_available(torch.device("cpu"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1.*chunked_linear_cross_entropy"):
        fused_linear_cross_entropy(x, weight, labels, scale, 2)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_head_available(torch.device("cpu"))
    assert triton_head_available(torch.device("cuda"))  # triton imports here


def test_interpreter_switched_on_after_triton_was_imported():
    """As in a whole test session: triton.language and the kernel module imported first (their
    @jit functions compiled-mode), TRITON_INTERPRET=1 set later."""
    code = """
import os, torch, triton.language
from layerslide.kernels.linear_cross_entropy import fused_linear_cross_entropy
os.environ["TRITON_INTERPRET"] = "1"
x, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, -100, 4])
loss, d_x, _ = fused_linear_cross_entropy(x, w, y, torch.tensor(1.0), 2, block=4)
ref = torch.nn.functional.cross_entropy(x @ w.T, y, reduction="sum")
assert torch.allclose(loss, ref, rtol=1e-5), (loss, ref)
assert d_x[1].abs().sum() == 0 and d_x[0].abs().sum() > 0
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_launch_config_covers_the_vocab():
    assert LaunchConfig.for_vocab(17) == LaunchConfig(block=32, num_warps=4)
    assert LaunchConfig.for_vocab(128256) == LaunchConfig(block=8192, num_warps=16)
    assert LaunchConfig.for_vocab(151936, block=4096) == LaunchConfig(block=4096, num_warps=8)
    with pytest.raises(ValueError, match="power of two"):
        LaunchConfig.for_vocab(100, block=48)


# -- real head shapes, on the GPU ------------------------------------------------------------

GPU_SHAPES = [  # tokens, hidden, vocab, chunk
    (8192, 2048, 128256, 2048),
    (16384, 4096, 151936, 4096),
]


def fp32_reference(x, weight, labels, scale):
    """Materialised fp32 logits from the bf16 inputs (TF32 off), autograd."""
    x32 = x.float().requires_grad_(True)
    w32 = weight.float().requires_grad_(True)
    loss = F.cross_entropy(x32 @ w32.T, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    (loss * scale).backward()
    return loss.detach(), x32.grad, w32.grad


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("tokens", "hidden", "vocab", "chunk"), GPU_SHAPES)
def test_real_shapes_match_a_materialised_reference(tokens, hidden, vocab, chunk, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    x, weight, labels, scale = make_inputs(tokens, hidden, vocab, torch.bfloat16, seed=1,
                                           device="cuda")
    loss, d_x, d_weight = fused_linear_cross_entropy(x, weight, labels, scale, chunk)
    bound = bf16_loss_bound(x, weight, labels)
    ref_loss, ref_dx, ref_dw = fp32_reference(x, weight, labels, scale)
    assert abs(float(loss) - float(ref_loss)) <= bound
    assert relative_error(d_x, ref_dx) < 2.0**-5
    assert relative_error(d_weight, ref_dw) < 2.0**-5
    assert torch.all(d_x[labels == IGNORE_INDEX] == 0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("tokens", "hidden", "vocab", "chunk"), [
    (32768, 3072, 128256, 4096), (65536, 8192, 128256, 8192), (16384, 4096, 151936, 1024)])
def test_real_shapes_agree_with_the_pytorch_chunked_path(tokens, hidden, vocab, chunk):
    """Too large to materialise the reference (65536 x 128256 fp32 logits are 31 GiB, and
    autograd keeps three such): the chunked path at the same chunk is the reference."""
    x, weight, labels, scale = make_inputs(tokens, hidden, vocab, torch.bfloat16, seed=2,
                                           device="cuda")
    loss, d_x, d_weight = fused_linear_cross_entropy(x, weight, labels, scale, chunk)
    ref_loss, ref_dx, ref_dw = chunked_linear_cross_entropy(x, weight, labels, scale, chunk)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=0.0)
    assert relative_error(d_x, ref_dx) < 2.0**-7
    assert relative_error(d_weight, ref_dw) < 2.0**-7


@pytest.mark.gpu
@needs_cuda
def test_real_shapes_use_one_bf16_logit_buffer():
    """Peak memory above the inputs and outputs: one [chunk, vocab] bf16 buffer, ~2 B/logit."""
    tokens, hidden, vocab, chunk = 16384, 4096, 151936, 4096
    x, weight, labels, scale = make_inputs(tokens, hidden, vocab, torch.bfloat16, device="cuda")
    outputs = x.numel() * 2 + weight.numel() * 2 + tokens * 4  # d_x, d_weight, row losses
    fused_linear_cross_entropy(x, weight, labels, scale, chunk)  # compile, warm cuBLAS
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fused_linear_cross_entropy(x, weight, labels, scale, chunk)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - outputs
    assert extra <= 1.25 * chunk * vocab * 2, extra
