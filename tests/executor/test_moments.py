"""Compact AdamW moments: the native kernel of each precision against the plain torch step of
executor/moments.py, the 8-bit maps, the buffers' layout, and edge values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerslide.executor.moments import (
    Moments,
    magnitude_map,
    moment_maps,
    moment_seed,
    torch_adamw_step,
)
from layerslide.executor.native import load_kernels
from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS, moments_nbytes

KERNELS = load_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no C compiler for the native kernels")
HYPER = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


def _grads(n: int, steps: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # a spread of magnitudes, as real grads have (blocks of big and of tiny ones)
    scales = torch.logspace(-6, 0, n)[torch.randperm(n, generator=gen)]
    return [(torch.randn(n, generator=gen) * scales).to(dtype) for _ in range(steps)]


def _run(step_fn, precision: str, n: int, grads: list[torch.Tensor], decay_end: int,
         weights: bool) -> tuple[torch.Tensor, Moments, torch.Tensor | None]:
    param = torch.randn(n, generator=torch.Generator().manual_seed(1))
    moments = Moments.zeros(precision, n)
    out = torch.empty(n, dtype=torch.bfloat16) if weights else None
    for step, grad in enumerate(grads, start=1):
        step_fn(param, moments, grad, out, decay_end, step)
    return param, moments, out


def _native(param, moments, grad, out, decay_end, step):
    KERNELS.adamw_step_moments(param=param, moments=moments, grad=grad, weights_out=out,
                               decay_end=decay_end, grad_scale=0.5, step=step,
                               seed=moment_seed(3, step), **HYPER)


def _reference(param, moments, grad, out, decay_end, step):
    torch_adamw_step(param, moments, grad, decay_end=decay_end, grad_scale=0.5, step=step,
                     seed=moment_seed(3, step), **HYPER)
    if out is not None:
        out.copy_(param)


@needs_kernels
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weights", [True, False])
def test_native_step_matches_the_torch_step(precision, grad_dtype, weights):
    n = 5 * MOMENT_BLOCK_ELEMENTS + 777  # a partial last block
    grads = _grads(n, 4, grad_dtype)
    p_native, m_native, w_native = _run(_native, precision, n, grads, 6000, weights)
    p_ref, m_ref, w_ref = _run(_reference, precision, n, grads, 6000, weights)
    torch.testing.assert_close(p_native, p_ref, rtol=1e-5, atol=1e-6)
    if weights:
        assert (w_native.float() - w_ref.float()).abs().max() <= 2 ** -7 * w_ref.float().abs().max()
    if precision == "fp32":
        return
    for name in ("exp_avg", "exp_avg_sq"):
        codes_native, codes_ref = m_native.tensors[name], m_ref.tensors[name]
        # the same noise and maps, so the same roundings, except where the C kernel's fused
        # multiply-adds (or an 8-bit scale an ulp apart) put a value on the other side of one
        differ = (codes_native.view(torch.uint8) != codes_ref.view(torch.uint8)).float().mean()
        assert differ.item() < 2e-3, f"{name}: {differ.item():.3%} of the codes differ"
    if precision == "int8":
        for name in ("exp_avg_scale", "exp_avg_sq_scale"):
            torch.testing.assert_close(m_native.tensors[name], m_ref.tensors[name], rtol=1e-6,
                                       atol=0)


@needs_kernels
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_compact_moments_track_fp32_moments(precision):
    n = 4 * MOMENT_BLOCK_ELEMENTS
    grads = _grads(n, 20, torch.float32, seed=4)
    _, exact, _ = _run(_native, "fp32", n, grads, n, False)
    _, compact, _ = _run(_native, precision, n, grads, n, False)
    m_exact, v_exact = exact.dequantized()
    m, v = compact.dequantized()
    # relative to each block's largest value: 8-bit codes hold ~2-3 digits near the top
    for approx, true in ((m, m_exact), (v, v_exact)):
        top = true.abs().view(-1, MOMENT_BLOCK_ELEMENTS).amax(1).repeat_interleave(
            MOMENT_BLOCK_ELEMENTS)
        error = ((approx - true).abs() / top).max().item()
        assert error < (0.03 if precision == "bf16" else 0.05), error
    # and not trivially: the moments moved
    assert v.abs().max() > 0 and m.abs().max() > 0


@needs_kernels
def test_results_do_not_depend_on_threads_chunks_or_how_a_block_is_cut():
    n = 9 * MOMENT_BLOCK_ELEMENTS + 5
    grad = _grads(n, 1, torch.bfloat16)[0]
    for precision in ("bf16", "int8"):
        results = []
        for threads, chunk, cut in ((1, 0, None), (2, 4096, None), (2, 1, 4 * 2048)):
            kernels = load_kernels(threads=threads, chunk=chunk)
            param = torch.ones(n)
            moments = Moments.zeros(precision, n)
            pieces = [(0, n)] if cut is None else [(0, cut), (cut, n)]
            for start, end in pieces:
                kernels.adamw_step_moments(
                    param=param[start:end], moments=moments.part(start, end),
                    grad=grad[start:end], weights_out=None, decay_end=n - start,
                    grad_scale=1.0, step=1, seed=7, index_base=start, **HYPER)
            results.append((param, moments))
        for param, moments in results[1:]:
            assert torch.equal(param, results[0][0])
            for name, tensor in moments.tensors.items():
                assert torch.equal(tensor, results[0][1].tensors[name]), (precision, name)


@needs_kernels
def test_zero_grads_keep_zero_moments_and_a_positive_v_never_codes_as_zero():
    n = 2 * MOMENT_BLOCK_ELEMENTS
    grad = torch.zeros(n)
    grad[0] = 1.0  # block 0: one large element beside tiny ones far below the map's range
    grad[1:MOMENT_BLOCK_ELEMENTS] = 1e-12
    moments = Moments.zeros("int8", n)
    KERNELS.adamw_step_moments(param=torch.zeros(n), moments=moments, grad=grad,
                               weights_out=None, decay_end=0, grad_scale=1.0, step=1, **HYPER)
    codes_v = moments.tensors["exp_avg_sq"]
    assert codes_v[0] == 255 and torch.all(codes_v[1:MOMENT_BLOCK_ELEMENTS] == 1)
    assert torch.all(codes_v[MOMENT_BLOCK_ELEMENTS:] == 0)  # block 1 saw only zeros
    assert moments.tensors["exp_avg_sq_scale"][1] == 0
    m, v = moments.dequantized()
    assert torch.all(m[MOMENT_BLOCK_ELEMENTS:] == 0) and torch.all(v[1:] < v[0])


@needs_kernels
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_non_finite_grads_poison_the_moments_as_fp32_does(precision):
    n = 2 * MOMENT_BLOCK_ELEMENTS
    grad = torch.ones(n)
    grad[5] = float("nan")
    grad[MOMENT_BLOCK_ELEMENTS + 1] = 3e38  # finite, but its square overflows
    moments, param = Moments.zeros(precision, n), torch.ones(n)
    KERNELS.adamw_step_moments(param=param, moments=moments, grad=grad, weights_out=None,
                               decay_end=n, grad_scale=1.0, step=1, **HYPER)
    m, v = moments.dequantized()
    assert torch.isnan(m[5]) and torch.isnan(param[5])
    assert not torch.isfinite(v[MOMENT_BLOCK_ELEMENTS + 1])
    if precision == "bf16":  # element by element, as fp32
        assert torch.isfinite(m[6]) and torch.isfinite(v[MOMENT_BLOCK_ELEMENTS + 2])
    else:  # 8-bit moments carry the NaN in their block's scale: the block is lost
        assert torch.isnan(moments.tensors["exp_avg_scale"]).all()
    # and the torch step agrees
    ref_moments, ref_param = Moments.zeros(precision, n), torch.ones(n)
    torch_adamw_step(ref_param, ref_moments, grad, decay_end=n, grad_scale=1.0, step=1, **HYPER)
    assert torch.equal(torch.isnan(param), torch.isnan(ref_param))


def test_skip_leaves_the_state_as_it_was():
    n = MOMENT_BLOCK_ELEMENTS + 3
    for precision in ("fp32", "bf16", "int8"):
        moments, param = Moments.zeros(precision, n), torch.ones(n)
        grad = torch.full((n,), 0.5)
        torch_adamw_step(param, moments, grad, decay_end=n, grad_scale=1.0, step=1,
                         skip=torch.tensor(1), **HYPER)
        assert torch.equal(param, torch.ones(n))
        assert all(torch.all(t == 0) for t in moments.tensors.values())
        torch_adamw_step(param, moments, grad, decay_end=n, grad_scale=1.0, step=1,
                         skip=torch.tensor(0), **HYPER)
        assert torch.all(param < 1)


def test_maps_are_ascending_and_span_their_decades():
    m_map = magnitude_map(7)
    assert len(m_map) == 128 and m_map[0] == 0 and m_map[-1] == np.float32(1.0)
    assert np.all(np.diff(m_map) > 0)
    assert m_map[1] == pytest.approx(1e-6 * 1.0, rel=1e-6)  # decade 0 holds its top only
    maps = moment_maps()
    assert len(maps.m_values) == 256 and maps.m_values[128 + 5] == -maps.m_values[5]
    assert len(maps.v_values) == 256 and np.all(np.diff(maps.v_values) > 0)


def test_layout_and_cuts():
    n = 3 * MOMENT_BLOCK_ELEMENTS + 1
    for precision in ("fp32", "bf16", "int8"):
        moments = Moments.zeros(precision, n)
        assert moments.nbytes == Moments.nbytes_of(precision, n) == moments_nbytes(n, precision)
        buffer = torch.zeros(moments.nbytes, dtype=torch.uint8)
        viewed = Moments.in_buffer(precision, n, buffer)
        viewed.tensors["exp_avg"].fill_(1)
        assert buffer.any()
        assert viewed.tensors["exp_avg"].untyped_storage().data_ptr() == buffer.data_ptr()
    int8 = Moments.zeros("int8", n)
    assert int8.part(MOMENT_BLOCK_ELEMENTS, n).tensors["exp_avg_scale"].numel() == 3
    with pytest.raises(ValueError, match="multiples of 2048"):
        int8.part(100, n)
    assert Moments.zeros("bf16", n).part(100, 200).numel == 100
