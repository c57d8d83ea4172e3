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
import gc
import json
import os
import statistics
import time
from pathlib import Path

# as the executor does when it initialises CUDA itself (here the probes initialise it first)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch

from layerslide.calibrate.gpu import host_sharing_rates
from layerslide.calibrate.host import memory_bandwidth
from layerslide.calibrate.sharing import fit_host_sharing
from layerslide.data.sources import SyntheticTokens
from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.executor.compute import layer_call
from layerslide.executor.optim import OptimConfig
from layerslide.hwprofiles import load_profile
from layerslide.hwprofiles.units import parse_bytes
from layerslide.kernels.linear_cross_entropy import fused_linear_cross_entropy
from layerslide.planner import sizes
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.simulator.predict import simulate
from layerslide.training.trainer import Trainer
from layerslide.tuner import SearchSpace, tune

GIB = 2**30


def timed_gpu(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def all_gpu_forward_backward_s(blocks: ModelBlocks, spec, train: TrainSpec,
                               layer_kernels: str) -> float:
    """Forward + recompute/backward of the whole model with every layer's weights resident,
    the executor's kernels (its layer call, the Triton head), no copies and no optimizer."""
    dev = torch.device("cuda")
    torch.cuda.set_per_process_memory_fraction(1.0)  # the reference runs uncapped
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
    call_layer = layer_call(layer_kernels, dev)

    def step() -> None:
        x = torch.nn.functional.embedding(ids, emb)
        saved = []
        with torch.no_grad():
            for layer in layers:
                saved.append(x)
                x = call_layer(layer, x, rope)
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            normed = norm(x)
        _, d_flat, _ = fused_linear_cross_entropy(
            normed.detach().view(-1, spec.hidden_size), emb, labels,
            torch.tensor(1.0 / tokens, device=dev), chunk)
        normed.backward(d_flat.view_as(normed))
        grad = x.grad
        for layer, inp in zip(reversed(layers), reversed(saved), strict=True):
            inp = inp.detach().requires_grad_(True)
            with torch.enable_grad():
                y = call_layer(layer, inp, rope)
            y.backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                p.grad = None
        torch.ops.aten.embedding_dense_backward(grad, ids, spec.vocab_size, -1, False)

    result = timed_gpu(step, repeats=3)
    layers.clear()
    torch.cuda.empty_cache()
    return result


def pcie_bytes_per_s() -> tuple[float, float]:
    n = GIB // 2
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = n / timed_gpu(lambda: gpu.copy_(host, non_blocking=True), 5)
    d2h = n / timed_gpu(lambda: host.copy_(gpu, non_blocking=True), 5)
    return h2d, d2h


def plan_bytes(plan, step: int, adamw_bytes_per_param: float = 28.0) -> dict[str, float]:
    """One steady step's bytes over PCIe each way and through host memory: the DMA of both
    directions once, each optimizer step's AdamW traffic (read p g m v, write p m v) plus what
    its task adds (upcast, bf16 write), casts (read fp32, write bf16), accumulations."""
    tasks = [t for t in plan.tasks if t.step == step]
    h2d = sum(t.bytes for t in tasks if t.lane == "h2d")
    d2h = sum(t.bytes for t in tasks if t.lane == "d2h")
    host = h2d + d2h
    for t in tasks:
        if t.kind == "optimizer_step" and t.lane == "cpu":
            host += adamw_bytes_per_param * t.params + t.bytes
        elif t.kind == "cast":
            host += 1.5 * t.bytes
        elif t.kind == "accumulate_grads":
            host += t.bytes
    return {"h2d_bytes": h2d, "d2h_bytes": d2h, "host_bytes": host}


def policy_label(p: dict) -> str:
    return (f"window {p['window']}, activations {p['activations']}, cast {p['cast']}, "
            f"GPU-updated blocks {p['gpu_updated_blocks']}"
            + (f", {p['host_grad_buffers']} grad buffers" if p["host_grad_buffers"] else ""))


def policy_for(args, spec, train: TrainSpec, optimizer: str, kernels: str, cap: int) -> Policy:
    if args.policy == "lean":
        return Policy.of(window=args.window, cast="gpu", host_grad_buffers=2,
                      cpu_optimizer=optimizer, layer_kernels=kernels)
    if args.policy == "default":
        return Policy.of(window=args.window, cpu_optimizer=optimizer, layer_kernels=kernels)
    space = SearchSpace(micro_batches=(train.micro_batch,), allow_nvme=False)
    result = tune(spec, load_profile(args.profile), seq_len=train.seq_len, space=space,
                  base_policy=Policy.of(cpu_optimizer=optimizer, layer_kernels=kernels),
                  gpu_memory_bytes=int(args.tune_cap_fraction * cap))
    if result.best is None:
        raise SystemExit(f"tune found nothing that fits at micro-batch {train.micro_batch}")
    return result.best.policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gpu-memory", default="24GiB")
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--policy", choices=("default", "tuned", "lean"), default="default",
                        help="default: Policy.of(window); tuned: the simulator's pick per batch "
                             "(layerslide.tuner, no NVMe, under --tune-cap-fraction of the cap); "
                             "lean: least host RAM (cast on the GPU, 2 pooled grad buffers)")
    parser.add_argument("--tune-cap-fraction", type=float, default=0.7,
                        help="tune under this fraction of the GPU cap: the planner does not "
                             "count every transient (e.g. the embedding's fp32 grad on CUDA)")
    parser.add_argument("--optimizers", default="native",
                        help="CPU optimizers to run side by side at each batch: native,torch")
    parser.add_argument("--layer-kernels", default="compiled",
                        help="layer kernels to run side by side at each batch: compiled,eager")
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
    # the same probes `layerslide calibrate` runs: 1 GiB fp32 arrays, torch's threads
    cpu_bw = memory_bandwidth(GIB // 4, repeats=5).value
    # the capacity CPU and DMA share, as calibrate fits it (calibrate.sharing)
    sharing = host_sharing_rates(64 * 2**20, GIB // 4, seconds=1.0, rounds=1)
    fitted = {m.key: m.value for m in fit_host_sharing(sharing)}
    shared_bw = fitted["shared_capacity_per_adamw"] * sharing["adamw"]["adamw"]
    host_bw = max(cpu_bw, shared_bw)  # the larger: a lower floor, a stricter ratio
    h2d_bw, d2h_bw = pcie_bytes_per_s()
    print(f"host memory bandwidth: CPU alone {cpu_bw / 1e9:.1f} GB/s, shared by AdamW and "
          f"the copies {shared_bw / 1e9:.1f} GB/s ({threads} threads); "
          f"H2D {h2d_bw / 1e9:.1f} GB/s, D2H {d2h_bw / 1e9:.1f} GB/s", flush=True)
    rows = []
    configs = [(int(b), o, k) for b in args.batches.split(",")
               for o in args.optimizers.split(",") for k in args.layer_kernels.split(",")]
    print(f"{spec.name}: {spec.total_params / 1e9:.2f} B params, policy {args.policy}", flush=True)
    gpu_s_of: dict[tuple[int, str], float] = {}
    for mb, optimizer, kernels in configs:
        train = TrainSpec(micro_batch=mb, seq_len=args.seq_len)
        policy = policy_for(args, spec, train, optimizer, kernels, cap)
        if (mb, kernels) not in gpu_s_of:
            gpu_s_of[mb, kernels] = all_gpu_forward_backward_s(blocks, spec, train, kernels)
        gpu_s = gpu_s_of[mb, kernels]
        plan = build_plan(spec, train, policy, num_steps=3)
        moved = plan_bytes(plan, step=1)
        host_s = moved["host_bytes"] / host_bw
        pcie_s = max(moved["h2d_bytes"] / h2d_bw, moved["d2h_bytes"] / d2h_bw)
        floor_s = max(gpu_s, host_s, pcie_s)
        torch.cuda.reset_peak_memory_stats()
        try:
            with Trainer(config=config, plan=build_plan(spec, train, policy),
                         optim=OptimConfig(lr=1e-5), device="cuda",
                         segment_steps=args.steps, gpu_memory_bytes=cap) as trainer:
                trainer.init_random(0)
                logs = trainer.fit(SyntheticTokens(spec.vocab_size, args.seq_len), args.steps)
                host_state_bytes = trainer.state.state_bytes()
                if mb == args.trace_batch and optimizer == "native" and kernels == "compiled":
                    trainer.trace(f"measured mb{mb}").save(
                        args.out / f"trace_measured_mb{mb}.json")
        except torch.OutOfMemoryError as err:
            print(f"micro-batch {mb}: out of GPU memory under the cap ({policy}): "
                  f"{str(err).splitlines()[0]}", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            continue
        # release this trainer's GPU and host memory before the next one is built (a live
        # `trainer` binding kept it until the next constructor returned: the next one's state
        # then ran out of the cap while being allocated)
        del trainer
        gc.collect()
        torch.cuda.empty_cache()
        predicted = simulate(plan, load_profile(args.profile), gpu_memory_bytes=cap)
        if mb == args.trace_batch and optimizer == "native" and kernels == "compiled":
            predicted.trace.save(args.out / f"trace_predicted_mb{mb}.json")
        step_s = statistics.median(log.step_s for log in logs[1:])
        row = {
            "micro_batch": mb, "cpu_optimizer": optimizer, "layer_kernels": kernels,
            "policy": policy.to_dict(), "predicted_step_s": predicted.step_s,
            "step_s": step_s, "tokens_per_s": train.tokens_per_step / step_s,
            "floor_s": floor_s, "ratio_to_floor": step_s / floor_s,
            "all_gpu_fwd_bwd_s": gpu_s, "host_traffic_s": host_s, "pcie_s": pcie_s,
            "gpu_peak_bytes": max(log.gpu_peak_bytes for log in logs),
            "gpu_reserved_peak_bytes": torch.cuda.max_memory_reserved(),
            "host_rss_peak_bytes": max(log.host_rss_bytes for log in logs),
            "host_state_bytes": host_state_bytes,
            "host_rss_gb_per_billion_params": max(log.host_rss_bytes for log in logs)
            / spec.total_params,
            "losses": [log.loss for log in logs], "step_times_s": [log.step_s for log in logs],
            **moved,
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("losses",)}), flush=True)
        torch.cuda.empty_cache()
    (args.out / "executor_bench.json").write_text(json.dumps(
        {"model": spec.name, "seq_len": args.seq_len, "gpu_memory_cap_bytes": cap,
         "host_bandwidth_bytes_per_s": host_bw, "cpu_alone_bandwidth_bytes_per_s": cpu_bw,
         "shared_bandwidth_bytes_per_s": shared_bw, "h2d_bytes_per_s": h2d_bw,
         "d2h_bytes_per_s": d2h_bw, "rows": rows}, indent=1))
    header = ("| micro-batch | policy | CPU optimizer | layers | step s | predicted s | tokens/s | floor s | "
              "step/floor | all-GPU fwd+bwd s | host traffic s | PCIe s | GPU peak GiB |")
    lines = [header, "|" + " --- |" * 13]
    lines += [f"| {r['micro_batch']} | {policy_label(r['policy'])} | {r['cpu_optimizer']} | "
              f"{r['layer_kernels']} | "
              f"{r['step_s']:.3f} | "
              f"{r['predicted_step_s']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{r['floor_s']:.3f} | {r['ratio_to_floor']:.2f} | {r['all_gpu_fwd_bwd_s']:.3f} | "
              f"{r['host_traffic_s']:.3f} | {r['pcie_s']:.3f} | "
              f"{r['gpu_peak_bytes'] / GIB:.1f} |" for r in rows]
    (args.out / "executor_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
