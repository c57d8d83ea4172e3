"""How long the host takes to dispatch one decoder layer's passes, per model family, against
the GPU time they take: the dispatch floor of the simulator's GPU tasks (issue 26).

For each model, one layer is called the way the executor calls it (`executor.compute.
layer_call`, compiled on a GPU), forward without grad and recompute + backward, at each token
count. Per pass and shape it records the GPU time (CUDA events, median), the host time to
enqueue it from an idle queue (median), the number of GPU kernels it launches (one profiled
call), and the tiny-kernel launch price calibrate measures, taken in the same process, so a
floor can be read in launches as well as in seconds. With --beside-adamw each pass is timed
again while the executor's CPU AdamW runs on every core in another thread of the process; with
--into-sum the projections' weight grads go into an fp32 sum as in a layer-major sweep.

usage: python benchmarks/probes/layer_dispatch_probe.py --models llama-3.2-3b qwen3-4b \
    --micro-batches 1 4 16 --out DIR   [--device cpu --kernels eager: the CPU test mode]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the bench
from layer_kernels_bench import layer_calls, time_ms

from layerslide.calibrate.gpu import median_launch_s
from layerslide.calibrate.host import adamw_blocks
from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.executor.compute import layer_call
from layerslide.executor.grad_into_sum import attach_sums, route_linears
from layerslide.planner.model import resolve_model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build(model: str, device: torch.device, kernels: str, into_sum: bool):
    spec = resolve_model(model)
    blocks = ModelBlocks(hf_config_from_spec(spec))
    with torch.device(device):
        layer = blocks.make_layer(0).to(torch.bfloat16)
    blocks.bind(layer, 0, (torch.randn(blocks.numel(0), device=device) * 0.02).to(torch.bfloat16))
    for p in layer.parameters():
        if p.dim() == 1:
            p.data.fill_(1.0)  # norm weights
    if into_sum:  # as a layer-major sweep runs it: projection grads straight into an fp32 sum
        route_linears(layer)
        attach_sums(layer, blocks, 0, torch.zeros(blocks.numel(0), device=device))
    return spec, layer, blocks.make_rotary(device), layer_call(kernels, device)


def host_ms(call, device: torch.device, repeats: int) -> float:
    """Median host time to enqueue `call` from an idle queue."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    sync(device)
    return statistics.median(times)


def gpu_ms(call, device: torch.device, repeats: int) -> float:
    """Median time of `call` from its first kernel to its last (host time on the CPU device)."""
    return time_ms(call, repeats) if device.type == "cuda" else host_ms(call, device, repeats)


def kernel_count(call, device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@contextmanager
def adamw_beside(block_params: int):
    """The executor's CPU AdamW on every core in a thread of this process, called over two
    block-sized arrays in turn until the block ends: what a dispatching thread runs beside."""
    steps, _ = adamw_blocks(block_params, 2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for step in steps:
                step()

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["llama-3.2-3b", "qwen3-4b", "mistral-7b"])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tiny-tokens", type=int, default=64,
                    help="one sequence this long: the GPU's work is negligible, the floor shows")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kernels", default="compiled", choices=("compiled", "eager"))
    ap.add_argument("--beside-adamw", type=int, default=0, metavar="PARAMS",
                    help="also time each pass beside the CPU AdamW on blocks of PARAMS")
    ap.add_argument("--into-sum", action="store_true",
                    help="route the projections' weight grads into an fp32 sum (layer-major)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    tiny = torch.zeros(1, device=device)
    launch = (median_launch_s(tiny, 2000, 5) * 1e6) if device.type == "cuda" else None
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "kernels": args.kernels, "into_sum": args.into_sum, "seq_len": args.seq_len, "tiny_launch_us": launch,
               "rows": []}
    shapes = [(1, args.tiny_tokens)] + [(mb, args.seq_len) for mb in args.micro_batches]
    for model in args.models:
        torch._dynamo.reset()  # each model compiles its own graphs
        spec, layer, rotary, fn = build(model, device, args.kernels, args.into_sum)
        for mb, seq in shapes:
            x = torch.randn(mb, seq, spec.hidden_size, device=device, dtype=torch.bfloat16)
            rope = rotary(x[:1, :1], torch.arange(seq, device=device)[None])
            forward, backward = layer_calls(fn, layer, x, torch.randn_like(x) * 1e-3, rope)
            calls = {"forward": forward, "backward": backward}
            for _ in range(3):  # warm-up and compile
                calls["forward"]()
                calls["backward"]()
            row = {"model": model, "micro_batch": mb, "seq_len": seq, "tokens": mb * seq}
            for name, call in calls.items():
                row[f"{name}_gpu_ms"] = round(gpu_ms(call, device, args.repeats), 4)
                row[f"{name}_host_ms"] = round(host_ms(call, device, args.repeats), 4)
                row[f"{name}_kernels"] = kernel_count(call, device)
            if args.beside_adamw:
                with adamw_beside(args.beside_adamw):
                    for name, call in calls.items():
                        row[f"{name}_gpu_ms_beside_adamw"] = round(
                            gpu_ms(call, device, args.repeats), 4)
                        row[f"{name}_host_ms_beside_adamw"] = round(
                            host_ms(call, device, args.repeats), 4)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            (args.out / "layer_dispatch.json").write_text(json.dumps(results, indent=1))
        del layer, fn
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
