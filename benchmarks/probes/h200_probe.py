"""Measure the GPU numbers the h200-bench profile and the GPU cost model rest on, on the H200
benchmark machine: bf16 GEMM efficiency by token count (the M dimension) at the shapes of
Llama-3.2-3B and Llama-3.1-8B layers, SDPA attention throughput, device copy bandwidth, and the
time of one Hugging Face LlamaDecoderLayer forward (no grad) and recompute + backward.

Run there (writes $OUT/probe.json and prints a summary):
    python3 benchmarks/probes/h200_probe.py --out "$OUT/probe.json"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SHAPES = {  # (hidden, ffn, q heads, kv heads, head_dim)
    "llama-3.2-3b": (3072, 8192, 24, 8, 128),
    "llama-3.1-8b": (4096, 14336, 32, 8, 128),
}
PEAK_BF16 = 989e12  # datasheet dense bf16, the profile's bf16_flops


def bench(fn, *, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds of fn() timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def layer_matrices(hidden, ffn, heads, kv_heads, head_dim):
    q, kv = heads * head_dim, kv_heads * head_dim
    return [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, ffn), (hidden, ffn),
            (ffn, hidden)]  # (in, out) of q, k, v, o, gate, up, down


def gemm_efficiency() -> dict:
    """Per model shape and token count: flop-weighted efficiency of the layer's GEMMs, forward
    (X W^T) and the two backward ones (dX = dY W, dW = dY^T X)."""
    out = {}
    for name, shape in SHAPES.items():
        rows = {}
        for m in TOKENS:
            flops, seconds = 0.0, 0.0
            for k, n in layer_matrices(*shape):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                f = 2.0 * m * k * n
                seconds += (bench(lambda x=x, w=w: x @ w.t()) + bench(lambda dy=dy, w=w: dy @ w)
                            + bench(lambda dy=dy, x=x: dy.t() @ x))
                flops += 3 * f
            rows[m] = {"tflops": flops / seconds / 1e12, "efficiency": flops / seconds / PEAK_BF16}
        out[name] = rows
    return out


def attention(batches=(1, 8, 32), seq=1024) -> dict:
    """SDPA causal, GQA, seq 1024: seconds and TFLOP/s counted as 4*s*d*heads per token
    forward (non-causal count, the planner's FLOPs) and 3x that for forward + backward."""
    import torch.nn.functional as F

    _, _, heads, kv_heads, d = SHAPES["llama-3.2-3b"]
    out = {}
    for b in batches:
        q = torch.randn(b, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, kv_heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(b, heads, seq, d, device="cuda", dtype=torch.bfloat16)

        def fwd(q=q, k=k, v=v):
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def fwd_bwd(q=q, k=k, v=v, go=go):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o.backward(go)

        flops = 4.0 * seq * d * heads * b * seq
        tf, tfb = bench(fwd), bench(fwd_bwd)
        out[b] = {"fwd_s": tf, "fwd_bwd_s": tfb, "fwd_efficiency": flops / tf / PEAK_BF16,
                  "fwd_bwd_efficiency": 3 * flops / tfb / PEAK_BF16}
    return out


def copy_bandwidth() -> dict:
    x = torch.randn(1024**3 // 2, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    s = bench(lambda: y.copy_(x))
    return {"bytes_per_s": 2 * x.numel() * 2 / s}


def hf_layer(batches=(1, 2, 4, 8, 16, 32), seq=1024) -> dict:
    """One HF LlamaDecoderLayer of Llama-3.2-3B shape: forward without grad, and the forward
    again with grad followed by backward (what per-layer checkpointing does in backward)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    hidden, ffn, heads, kv_heads, d = SHAPES["llama-3.2-3b"]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=d, num_hidden_layers=1,
                         max_position_embeddings=131072, rope_theta=500000.0,
                         torch_dtype=torch.bfloat16)
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, layer_idx=0).to("cuda", torch.bfloat16)
    rotary = LlamaRotaryEmbedding(config).to("cuda")
    out = {}
    for b in batches:
        x = torch.randn(b, seq, hidden, device="cuda", dtype=torch.bfloat16)
        pos = torch.arange(seq, device="cuda").unsqueeze(0).expand(b, -1)
        cos_sin = rotary(x, pos)
        go = torch.randn_like(x)

        def run(inp, pos=pos, cos_sin=cos_sin):
            result = layer(inp, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
            return result[0] if isinstance(result, tuple) else result

        def fwd(x=x):
            with torch.no_grad():
                run(x)

        def recompute_bwd(x=x, go=go):
            xg = x.detach().requires_grad_(True)
            run(xg).backward(go)

        out[b] = {"tokens": b * seq, "fwd_s": bench(fwd), "recompute_bwd_s": bench(recompute_bwd)}
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, fn in (("copy", copy_bandwidth), ("gemm", gemm_efficiency),
                     ("attention", attention), ("hf_layer", hf_layer)):
        try:
            results[name] = fn()
        except Exception as err:  # noqa: BLE001 (one failing probe must not cost the others)
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        print(name, json.dumps(results[name])[:1500], flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print("written", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
