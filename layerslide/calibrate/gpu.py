"""GPU measurements: GEMM and attention efficiency at a model's shapes, HBM bandwidth, launch
cost and the host<->GPU copies. Efficiencies are fractions of the profile's bf16 peak."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.nn import functional

from layerslide.calibrate.host import GIB, Measurement
from layerslide.planner.model import ModelSpec


def _cuda_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of fn on the current stream, after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def layer_gemm_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) of a decoder layer's seven GEMMs: q, k, v, o, gate, up, down."""
    h, q, kv, f = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]


def matmul_efficiency(model: ModelSpec, tokens: list[int], peak_flops: float,
                      repeats: int) -> Measurement:
    """FLOP-weighted efficiency of a layer's GEMMs, forward and both backward products."""
    dev = torch.device("cuda")
    points = []
    for t in tokens:
        flops, ms = 0.0, 0.0
        for k, n in layer_gemm_shapes(model):
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            dy = torch.randn(t, n, device=dev, dtype=torch.bfloat16)
            for fn in (lambda x=x, w=w: x @ w.T, lambda dy=dy, w=w: dy @ w,
                       lambda dy=dy, x=x: dy.T @ x):
                ms += _cuda_ms(fn, repeats)
                flops += 2.0 * t * k * n
        points.append((t, round(flops / (ms / 1e3) / peak_flops, 3)))
    return Measurement(key="gpu.matmul_efficiency", value=tuple(points),
                       how=f"{model.name} layer GEMMs (7, forward + 2 backward each), bf16, "
                           f"median of {repeats}, FLOP-weighted, vs {peak_flops / 1e12:.0f} "
                           "TFLOP/s")


def attention_efficiency(model: ModelSpec, seq_len: int, tokens: list[int], peak_flops: float,
                         repeats: int) -> list[Measurement]:
    """Causal SDPA forward, and forward + backward, at micro-batch tokens / seq_len."""
    dev = torch.device("cuda")
    a, g, d = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    forward, both = [], []
    for t in tokens:
        b = max(1, t // seq_len)
        q = torch.randn(b, a, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, g, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, g, seq_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        flops = 4.0 * seq_len * a * d * b * seq_len  # non-causal count, as the cost model

        def run_forward(q=q, k=k, v=v) -> torch.Tensor:
            with torch.no_grad():
                return functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=g != a)

        def run_both(q=q, k=k, v=v) -> None:
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=g != a)
            out.backward(torch.ones_like(out))

        forward.append((b * seq_len, round(flops / (_cuda_ms(run_forward, repeats) / 1e3)
                                           / peak_flops, 3)))
        both.append((b * seq_len, round(3 * flops / (_cuda_ms(run_both, repeats) / 1e3)
                                        / peak_flops, 3)))
    how = (f"SDPA causal, {a}/{g} heads x {d}, seq {seq_len}, median of {repeats}; FLOPs "
           "4*s*heads*head_dim per token forward")
    return [Measurement(key="gpu.attention_forward_efficiency", value=tuple(forward), how=how),
            Measurement(key="gpu.attention_backward_efficiency", value=tuple(both),
                        how=how + ", 3x for forward + backward")]


def device_basics(repeats: int) -> list[Measurement]:
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    src = torch.empty(GIB, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    hbm = 2 * GIB / (_cuda_ms(lambda: dst.copy_(src), repeats) / 1e3)
    tiny = torch.zeros(1, device=dev)
    launches = 2000
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        tiny.add_(1)
    torch.cuda.synchronize()
    launch_s = (time.perf_counter() - start) / launches
    return [Measurement(key="gpu.name", value=props.name, how="torch.cuda device name"),
            Measurement(key="gpu.memory", value=props.total_memory, how="total device memory"),
            Measurement(key="gpu.hbm_bandwidth", value=hbm,
                        how=f"1 GiB device-to-device copy, bytes read + written, median of "
                            f"{repeats}"),
            Measurement(key="gpu.kernel_launch", value=launch_s,
                        how=f"{launches} tiny kernel launches from Python")]


def link(nbytes: int, repeats: int) -> list[Measurement]:
    """Pinned H2D and D2H alone and at once (total of both), and H2D from pageable memory."""
    dev = torch.device("cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned_back = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    on_gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    from_gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    h2d = nbytes / (_cuda_ms(lambda: on_gpu.copy_(pinned, non_blocking=True), repeats) / 1e3)
    d2h = nbytes / (_cuda_ms(lambda: pinned_back.copy_(from_gpu, non_blocking=True),
                             repeats) / 1e3)
    pageable_rate = nbytes / (_cuda_ms(lambda: on_gpu.copy_(pageable), repeats) / 1e3)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(up):
            on_gpu.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(down):
            pinned_back.copy_(from_gpu, non_blocking=True)
        torch.cuda.current_stream().wait_stream(up)
        torch.cuda.current_stream().wait_stream(down)

    duplex = 2 * nbytes / (_cuda_ms(both, repeats) / 1e3)
    how = f"{nbytes / GIB:.2f} GiB copies, median of {repeats}"
    return [Measurement(key="link.h2d", value=h2d, how="pinned H2D, " + how),
            Measurement(key="link.d2h", value=d2h, how="pinned D2H, " + how),
            Measurement(key="link.duplex", value=duplex,
                        how="pinned H2D + D2H at once on two streams, total, " + how),
            Measurement(key="link.h2d_pageable", value=pageable_rate,
                        how="H2D from pageable memory, " + how)]
