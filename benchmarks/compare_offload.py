"""layerslide against DeepSpeed ZeRO-3 CPU offload and all-GPU PyTorch, side by side: same HF
model shape, synthetic tokens, sequence length and micro-batch; each run in a fresh process.

    python benchmarks/compare_offload.py --out results/compare            # the whole matrix
    python benchmarks/compare_offload.py --system deepspeed --micro-batch 8 --one   # one run

Systems:
  layerslide  the executor, default policy, GPU capped at --gpu-memory
  deepspeed   ZeRO-3, parameters and optimizer offloaded to pinned CPU memory (DeepSpeedCPUAdam),
              per-layer activation checkpointing, bf16; GPU capped at --gpu-memory
  torch       all on the GPU, uncapped (the no-offload reference): fp32 weights, bf16 autocast,
              per-layer activation checkpointing, torch's fused CUDA AdamW
Records s/step (median after the warm-up steps), tokens/s, model TFLOP/s, peak GPU memory
(allocated and reserved) and peak host RSS; writes compare.csv, compare.md and compare.png.
Not yet run on the GPU machine (issue 6): the first run there is its test.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 2**30
SYSTEMS = ("layerslide", "deepspeed", "torch")


class PeakRss:
    """Samples this process's RSS every 50 ms; .peak is the largest seen."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.05):
            with open("/proc/self/statm") as f:
                self.peak = max(self.peak, int(f.read().split()[1]) * page)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def hf_model(spec, device: str, dtype):
    """The HF causal LM of a planner preset, random weights, per-layer checkpointing."""
    import torch
    from transformers import AutoModelForCausalLM

    from layerslide.executor.blocks import hf_config_from_spec

    config = hf_config_from_spec(spec)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def step_times_torch(spec, mb: int, seq: int, steps: int, device: str) -> list[float]:
    import torch

    model = hf_model(spec, device, torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95),
                            fused=device.startswith("cuda"))
    times = []
    for _ in range(steps):
        ids = torch.randint(0, spec.vocab_size, (mb, seq), device=device)
        start = time.perf_counter()
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def step_times_deepspeed(spec, mb: int, seq: int, steps: int, cap: int) -> list[float]:
    import deepspeed
    import torch

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, cap / torch.cuda.get_device_properties(0).total_memory))
    ds_config = {
        "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
    }
    deepspeed.init_distributed()
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = hf_model(spec, "cpu", torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, spec.vocab_size, (mb, seq), device=engine.device)
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def step_times_layerslide(spec, mb: int, seq: int, steps: int, cap: int,
                          device: str) -> list[float]:
    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.executor.data import SyntheticTokens
    from layerslide.executor.optim import OptimConfig
    from layerslide.executor.trainer import Trainer
    from layerslide.planner.settings import Policy, TrainSpec

    with Trainer(config=hf_config_from_spec(spec), spec=spec,
                 train=TrainSpec(micro_batch=mb, seq_len=seq), policy=Policy(),
                 optim=OptimConfig(lr=1e-5), device=device, gpu_memory_bytes=cap,
                 keep_trace=False) as trainer:
        trainer.init_random(0)
        return [log.step_s for log in trainer.fit(SyntheticTokens(spec.vocab_size, seq), steps)]


def run_one(args) -> dict:
    import torch

    from layerslide.hwprofiles.units import parse_bytes
    from layerslide.planner.model import resolve_model

    spec = resolve_model(args.model)
    cap = parse_bytes(args.gpu_memory)
    rss = PeakRss()
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if args.system == "torch":
        times = step_times_torch(spec, args.micro_batch, args.seq_len, args.steps, args.device)
    elif args.system == "deepspeed":
        times = step_times_deepspeed(spec, args.micro_batch, args.seq_len, args.steps, cap)
    else:
        times = step_times_layerslide(spec, args.micro_batch, args.seq_len, args.steps, cap,
                                      args.device)
    step_s = statistics.median(times[2:] or times[-1:])
    tokens = args.micro_batch * args.seq_len
    return {"system": args.system, "model": spec.name, "micro_batch": args.micro_batch,
            "seq_len": args.seq_len, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops": spec.training_flops_per_token(args.seq_len) * tokens / step_s / 1e12,
            "gpu_allocated_peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
            "gpu_reserved_peak_bytes": torch.cuda.max_memory_reserved() if cuda else 0,
            "host_rss_peak_bytes": rss.stop(), "step_times_s": times}


def write_report(rows: list[dict], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fields = ["system", "model", "micro_batch", "seq_len", "step_s", "tokens_per_s",
              "model_tflops", "gpu_allocated_peak_bytes", "gpu_reserved_peak_bytes",
              "host_rss_peak_bytes"]
    with open(out / "compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [("| system | model | micro-batch | s/step | tokens/s | TFLOP/s | GPU alloc GiB | "
             "GPU reserved GiB | host RSS GiB |"), "|" + " --- |" * 9]
    lines += [f"| {r['system']} | {r['model']} | {r['micro_batch']} | {r['step_s']:.3f} | "
              f"{r['tokens_per_s']:,.0f} | {r['model_tflops']:.1f} | "
              f"{r['gpu_allocated_peak_bytes'] / GIB:.1f} | "
              f"{r['gpu_reserved_peak_bytes'] / GIB:.1f} | {r['host_rss_peak_bytes'] / GIB:.1f} |"
              for r in rows]
    by = {(r["system"], r["model"], r["micro_batch"]): r for r in rows}
    for (system, model, mb), r in sorted(by.items()):
        ds = by.get(("deepspeed", model, mb))
        if system == "layerslide" and ds is not None:
            lines.append(f"- {model} micro-batch {mb}: layerslide "
                         f"{r['tokens_per_s'] / ds['tokens_per_s']:.2f}x DeepSpeed's tokens/s, "
                         f"GPU {r['gpu_allocated_peak_bytes'] / ds['gpu_allocated_peak_bytes']:.2f}x,"
                         f" host RSS {r['host_rss_peak_bytes'] / ds['host_rss_peak_bytes']:.2f}x")
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    panels = (("tokens_per_s", "tokens/s", 1.0), ("gpu_allocated_peak_bytes", "GPU GiB", 1 / GIB),
              ("host_rss_peak_bytes", "host RSS GiB", 1 / GIB))
    for k, (key, label, scale) in enumerate(panels):
        ax = fig.add_subplot(1, 3, k + 1)
        for system in SYSTEMS:
            mine = sorted((r["micro_batch"], r[key] * scale) for r in rows
                          if r["system"] == system and r["model"] == rows[0]["model"])
            if mine:
                ax.plot(*zip(*mine, strict=True), marker="o", label=system)
        ax.set(xscale="log", xlabel="micro-batch", ylabel=label, title=rows[0]["model"])
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--system", choices=SYSTEMS, help="with --one: the system to run")
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--micro-batches", default="1,4,8,16,32")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpu-memory", default="24GiB")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--one", action="store_true", help="run --system once, print its row")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.one:
        print("ROW " + json.dumps(run_one(args)), flush=True)
        return
    if args.out is None:
        ap.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in (int(m) for m in args.micro_batches.split(",")):
        for system in args.systems.split(","):
            child = [sys.executable, __file__, "--one", "--system", system, "--micro-batch",
                     str(mb), "--model", args.model, "--seq-len", str(args.seq_len),
                     "--steps", str(args.steps), "--gpu-memory", args.gpu_memory,
                     "--device", args.device]
            print(f"{system} micro-batch {mb}", flush=True)
            try:
                done = subprocess.run(child, capture_output=True, text=True, check=False,
                                      timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"  timed out after {args.timeout} s", flush=True)
                continue
            row = next((json.loads(line[4:]) for line in done.stdout.splitlines()
                        if line.startswith("ROW ")), None)
            if row is None:
                print(f"  failed (exit {done.returncode}): {done.stderr.strip()[-400:]}",
                      flush=True)
                continue
            rows.append(row)
            print(f"  {row['step_s']:.3f} s/step, {row['tokens_per_s']:,.0f} tokens/s", flush=True)
            (args.out / "compare.json").write_text(json.dumps(rows, indent=1))
    if rows:
        write_report(rows, args.out)


if __name__ == "__main__":
    main()
