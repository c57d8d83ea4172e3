"""Executor step time per micro-batch next to its floor, every input measured in this one run.

For each micro-batch: the executor's steady step time (median of the steps after the first),
and the floor max(all-GPU forward+backward with the same kernels and weights resident,
host-memory bytes per step / measured host memory bandwidth, PCIe bytes per step / measured
copy bandwidth). Writes a JSON and a markdown table, and the measured trace of one batch next to
the simulator's prediction.

    python benchmarks/executor_bench.py --out results/ [--batches 1,8] [--gpu-memory 24GiB]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.executor.data import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.executor.runner import _call_layer, _chunked_linear_cross_entropy
from layerslide.executor.trainer import Trainer
from layerslide.hwprofiles import load_profile
from layerslide.hwprofiles.units import parse_bytes
from layerslide.planner import sizes
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.simulator.predict import simulate

GIB = 2**30


def timed_gpu(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def all_gpu_forward_backward_s(blocks: ModelBlocks, spec, train: TrainSpec) -> float:
    """Forward + recompute/backward of the whole model with every layer's weights resident,
    the executor's kernels (HF layers, chunked head), no copies and no optimizer."""
    dev = torch.device("cuda")
    with torch.device(dev):
        layers = []
        for i in range(spec.num_layers):
            flat = torch.randn(blocks.numel(i), dtype=torch.bfloat16) * 0.02
            with torch.device("meta"):
                layer = blocks.make_layer(i)
            blocks.bind(layer, i, flat)
            layers.append(layer)
        emb = torch.randn(spec.vocab_size, spec.hidden_size, dtype=torch.bfloat16) * 0.02
        norm = blocks.make_norm().to(torch.bfloat16)
        rotary = blocks.make_rotary(dev)
    tokens = train.tokens_per_micro_batch
    ids = torch.randint(0, spec.vocab_size, (train.micro_batch, train.seq_len), device=dev)
    labels = ids.view(-1)
    rope = rotary(torch.empty(1, dtype=torch.bfloat16, device=dev),
                  torch.arange(train.seq_len, device=dev)[None])
    chunk = sizes.fused_head_chunk_tokens(spec, tokens)

    def step() -> None:
        x = torch.nn.functional.embedding(ids, emb)
        saved = []
        with torch.no_grad():
            for layer in layers:
                saved.append(x)
                x = _call_layer(layer, x, rope)
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            normed = norm(x)
        _, d_flat, _ = _chunked_linear_cross_entropy(
            normed.detach().view(-1, spec.hidden_size), emb, labels,
            torch.tensor(1.0 / tokens, device=dev), chunk)
        normed.backward(d_flat.view_as(normed))
        grad = x.grad
        for layer, inp in zip(reversed(layers), reversed(saved), strict=True):
            inp = inp.detach().requires_grad_(True)
            with torch.enable_grad():
                y = _call_layer(layer, inp, rope)
            y.backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                p.grad = None
        torch.ops.aten.embedding_dense_backward(grad, ids, spec.vocab_size, -1, False)

    result = timed_gpu(step, repeats=3)
    layers.clear()
    torch.cuda.empty_cache()
    return result


def host_bandwidth_bytes_per_s(threads: int) -> float:
    """Read + write bytes per second of a large fp32 -> fp32 copy with torch's threads."""
    torch.set_num_threads(threads)
    src = torch.ones(512 * 2**20 // 4 * 4)  # 2 GiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    elapsed = (time.perf_counter() - start) / 5
    return 2 * src.numel() * 4 / elapsed


def pcie_bytes_per_s() -> tuple[float, float]:
    n = GIB // 2
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = n / timed_gpu(lambda: gpu.copy_(host, non_blocking=True), 5)
    d2h = n / timed_gpu(lambda: host.copy_(gpu, non_blocking=True), 5)
    return h2d, d2h


def plan_bytes(plan, step: int) -> dict[str, float]:
    """Per-step bytes of one steady step: over PCIe each way, and through host memory."""
    params = sum(sizes.block_params(plan.model, b)
                 for b in range(-1, plan.model.num_layers + 1))
    h2d = sum(t.bytes for t in plan.tasks if t.step == step and t.lane == "h2d")
    d2h = sum(t.bytes for t in plan.tasks if t.step == step and t.lane == "d2h")
    # host memory: the DMA of both directions once, fused AdamW (read p g m v, write p m v:
    # 28 B/param), the fp32 upcast of bf16 grads (read 2, write 4), the cast (read 4, write 2)
    host = h2d + d2h + (28 + 6 + 6) * params
    return {"h2d_bytes": h2d, "d2h_bytes": d2h, "host_bytes": host}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gpu-memory", default="24GiB")
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--profile", default="h200-bench")
    parser.add_argument("--trace-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = resolve_model(args.model)
    config = hf_config_from_spec(spec)
    blocks = ModelBlocks(config)
    cap = parse_bytes(args.gpu_memory)
    threads = torch.get_num_threads()
    host_bw = host_bandwidth_bytes_per_s(threads)
    h2d_bw, d2h_bw = pcie_bytes_per_s()
    print(f"host copy bandwidth {host_bw / 1e9:.1f} GB/s ({threads} threads); "
          f"H2D {h2d_bw / 1e9:.1f} GB/s, D2H {d2h_bw / 1e9:.1f} GB/s", flush=True)
    rows = []
    for mb in (int(b) for b in args.batches.split(",")):
        train = TrainSpec(micro_batch=mb, seq_len=args.seq_len)
        policy = Policy(window=args.window)
        gpu_s = all_gpu_forward_backward_s(blocks, spec, train)
        plan = build_plan(spec, train, policy, num_steps=3)
        moved = plan_bytes(plan, step=1)
        host_s = moved["host_bytes"] / host_bw
        pcie_s = max(moved["h2d_bytes"] / h2d_bw, moved["d2h_bytes"] / d2h_bw)
        floor_s = max(gpu_s, host_s, pcie_s)
        torch.cuda.reset_peak_memory_stats()
        with Trainer(config=config, spec=spec, train=train, policy=policy,
                     optim=OptimConfig(lr=1e-5), device="cuda", segment_steps=args.steps,
                     gpu_memory_bytes=cap) as trainer:
            trainer.init_random(0)
            logs = trainer.fit(SyntheticTokens(spec.vocab_size, args.seq_len), args.steps)
            if mb == args.trace_batch:
                trainer.trace(f"measured mb{mb}").save(args.out / f"trace_measured_mb{mb}.json")
                predicted = simulate(plan, load_profile(args.profile), gpu_memory_bytes=cap)
                predicted.trace.save(args.out / f"trace_predicted_mb{mb}.json")
            host_state_bytes = trainer.state.state_bytes()
        step_s = statistics.median(log.step_s for log in logs[1:])
        row = {
            "micro_batch": mb, "step_s": step_s, "tokens_per_s": train.tokens_per_step / step_s,
            "floor_s": floor_s, "ratio_to_floor": step_s / floor_s,
            "all_gpu_fwd_bwd_s": gpu_s, "host_traffic_s": host_s, "pcie_s": pcie_s,
            "gpu_peak_bytes": max(log.gpu_peak_bytes for log in logs),
            "gpu_reserved_peak_bytes": torch.cuda.max_memory_reserved(),
            "host_rss_peak_bytes": max(log.host_rss_bytes for log in logs),
            "host_state_bytes": host_state_bytes,
            "losses": [log.loss for log in logs], "step_times_s": [log.step_s for log in logs],
            **moved,
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("losses",)}), flush=True)
        torch.cuda.empty_cache()
    (args.out / "executor_bench.json").write_text(json.dumps(
        {"model": spec.name, "seq_len": args.seq_len, "gpu_memory_cap_bytes": cap,
         "host_bandwidth_bytes_per_s": host_bw, "h2d_bytes_per_s": h2d_bw,
         "d2h_bytes_per_s": d2h_bw, "rows": rows}, indent=1))
    header = ("| micro-batch | step s | tokens/s | floor s | step/floor | all-GPU fwd+bwd s | "
              "host traffic s | PCIe s | GPU peak GiB |")
    lines = [header, "|" + " --- |" * 9]
    lines += [f"| {r['micro_batch']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{r['floor_s']:.3f} | {r['ratio_to_floor']:.2f} | {r['all_gpu_fwd_bwd_s']:.3f} | "
              f"{r['host_traffic_s']:.3f} | {r['pcie_s']:.3f} | "
              f"{r['gpu_peak_bytes'] / GIB:.1f} |" for r in rows]
    (args.out / "executor_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
