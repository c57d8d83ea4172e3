"""Where an offloaded step's GPU time goes inside one decoder layer, and what fused kernels buy.

Runs one HF decoder layer the way the executor does (forward without grad, then recompute plus
backward) at the given micro-batches, for one variant per process (the liger variant patches
transformers' modules globally):
  eager   HF's modules as the executor runs them today
  liger   HF's modules with liger-kernel's RMSNorm, SwiGLU and RoPE patched in
  compile the eager layer under torch.compile (Inductor's fused Triton kernels)
Prints the median times and, for eager, the top GPU kernels of one recompute+backward by total time
grouped into families (GEMM, attention, norm, activation, rope, copy, other).

usage: python benchmarks/layer_kernels_bench.py --variant eager --micro-batches 8 64 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.executor.compute import call_layer
from layerslide.planner.model import resolve_model

FAMILIES = (("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
            ("attention", ("flash", "fmha", "attention", "sdpa")),
            ("copy", ("copy", "memcpy", "cat")),
            ("reduce", ("reduce",)),
            ("elementwise", ("elementwise", "vectorized")))


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def build_layer(variant: str, model: str):
    if variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)
    spec = resolve_model(model)
    blocks = ModelBlocks(hf_config_from_spec(spec))
    dev = torch.device("cuda")
    with torch.device(dev):
        layer = blocks.make_layer(0).to(torch.bfloat16)
    flat = (torch.randn(blocks.numel(0), device=dev) * 0.02).to(torch.bfloat16)
    blocks.bind(layer, 0, flat)
    for p in layer.parameters():
        if p.dim() == 1:
            p.data.fill_(1.0)  # norm weights
    rotary = blocks.make_rotary(dev)
    fn = call_layer
    if variant == "compile":
        fn = torch.compile(call_layer)
    return spec, layer, rotary, fn


def time_ms(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def layer_calls(fn, layer, x, dy, rope):
    """The executor's two calls of a layer: forward without grad; recompute then backward."""
    def forward():
        with torch.no_grad():
            fn(layer, x, rope)

    def backward():
        xi = x.detach().requires_grad_(True)
        with torch.enable_grad():
            y = fn(layer, xi, rope)
        y.backward(dy)
        for p in layer.parameters():
            p.grad = None

    return forward, backward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=("eager", "liger", "compile"), required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec, layer, rotary, fn = build_layer(args.variant, args.model)
    results = {"variant": args.variant, "model": args.model, "seq_len": args.seq_len,
               "num_layers": spec.num_layers, "cases": []}
    for mb in args.micro_batches:
        x = torch.randn(mb, args.seq_len, spec.hidden_size, device="cuda",
                        dtype=torch.bfloat16)
        dy = torch.randn_like(x) * 1e-3
        positions = torch.arange(args.seq_len, device="cuda")[None]
        rope = rotary(x[:1, :1], positions)

        forward, backward = layer_calls(fn, layer, x, dy, rope)

        for _ in range(3):  # warm-up (and compile)
            forward()
            backward()
        torch.cuda.reset_peak_memory_stats()
        fwd = time_ms(forward, args.repeats)
        bwd = time_ms(backward, args.repeats)
        case = {"micro_batch": mb, "forward_ms": fwd, "recompute_backward_ms": bwd,
                "layer_total_ms": fwd + bwd,
                "all_layers_s": (fwd + bwd) * spec.num_layers / 1e3,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
        if args.variant == "eager":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                backward()
                torch.cuda.synchronize()
            by_family: dict[str, float] = {}
            kernels = []
            for ev in prof.key_averages():
                us = ev.device_time_total
                if us <= 0:
                    continue
                by_family[family(ev.key)] = by_family.get(family(ev.key), 0.0) + us / 1e3
                kernels.append((us / 1e3, ev.count, ev.key[:110]))
            case["recompute_backward_by_family_ms"] = by_family
            case["top_kernels"] = sorted(kernels, reverse=True)[:25]
        results["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "top_kernels"}), flush=True)
        for k in case.get("top_kernels", []):
            print(f"  {k[0]:8.3f} ms x{k[1]:3d}  {k[2]}")
        del x, dy
        torch.cuda.empty_cache()
    (args.out / f"layer_kernels_{args.variant}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
