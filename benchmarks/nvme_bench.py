"""AdamW moments on disk against in RAM: measured step time next to the simulator's prediction
for the disk speed measured in the same run.

First measures the disk the way the NVMe tier uses it (O_DIRECT, 64 MiB calls, page-aligned
buffers), then trains the same model with each --fractions value of moments_on_nvme and
simulates each plan on the profile with that disk speed put in.

    python benchmarks/nvme_bench.py --model llama-3.2-1b --fractions 0,1 --nvme-dir /tmp/nvme \
        --out results/nvme
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from layerslide.calibrate.host import disk
from layerslide.data.sources import SyntheticTokens
from layerslide.executor.blocks import hf_config_from_spec
from layerslide.executor.optim import OptimConfig
from layerslide.hwprofiles import load_profile
from layerslide.hwprofiles.units import parse_bytes
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.simulator.predict import simulate
from layerslide.training.trainer import Trainer

GIB = 2**30


def disk_rates(folder: Path, nbytes: int) -> tuple[float, float, float]:
    """(write, read, both at once) bytes/s of files of nbytes, as `layerslide calibrate`
    measures them."""
    rates = {m.key: m.value for m in disk(folder, nbytes)}
    return rates["storage.write"], rates["storage.read"], rates["storage.duplex"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--fractions", default="0,1", help="moments_on_nvme values to run")
    ap.add_argument("--lean", action="store_true",
                    help="least host RAM: cast on the GPU, 2 pooled grad buffers")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--nvme-dir", type=Path, required=True)
    ap.add_argument("--probe-gib", type=float, default=4.0)
    ap.add_argument("--gpu-memory", default="24GiB")
    ap.add_argument("--profile", default="h200-bench")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_bw, read_bw, duplex_bw = disk_rates(args.nvme_dir, int(args.probe_gib * GIB))
    print(f"disk (O_DIRECT, 64 MiB calls): write {write_bw / 1e9:.2f} GB/s, read "
          f"{read_bw / 1e9:.2f} GB/s, both at once {duplex_bw / 1e9:.2f} GB/s", flush=True)
    profile = load_profile(args.profile)
    measured = dataclasses.replace(profile, storage=dataclasses.replace(
        profile.storage, read_bytes_per_s=read_bw, write_bytes_per_s=write_bw,
        duplex_bytes_per_s=duplex_bw))
    spec = resolve_model(args.model)
    config = hf_config_from_spec(spec)
    train = TrainSpec(micro_batch=args.micro_batch, seq_len=args.seq_len)
    cap = parse_bytes(args.gpu_memory)
    rows = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        lean = {"cast": "gpu", "host_grad_buffers": 2} if args.lean else {}
        policy = Policy.of(moments_on_nvme=fraction, **lean)
        plan = build_plan(spec, train, policy, num_steps=3)
        predicted = simulate(plan, measured, gpu_memory_bytes=cap)
        with Trainer(config=config, plan=build_plan(spec, train, policy),
                     optim=OptimConfig(lr=1e-5), device="cuda", gpu_memory_bytes=cap,
                     nvme_dir=args.nvme_dir, keep_trace=False) as trainer:
            trainer.init_random(0)
            start = time.perf_counter()
            print(f"moments_on_nvme {fraction}: state ready", flush=True)
            logs = trainer.fit(SyntheticTokens(spec.vocab_size, args.seq_len), args.steps,
                               on_step_done=lambda s, t0=start: print(
                                   f"  step {s + 1} done at {time.perf_counter() - t0:.1f} s",
                                   flush=True))
        step_s = statistics.median(log.step_s for log in logs[1:])
        disk_bytes = sum(t.bytes for t in plan.tasks if t.step == 1 and t.kind in
                         ("nvme_read", "nvme_write"))
        row = {"moments_on_nvme": fraction, "step_s": step_s,
               "predicted_step_s": predicted.step_s,
               "predicted_bottleneck": predicted.bottleneck,
               "disk_bytes_per_step": disk_bytes,
               "host_rss_peak_bytes": max(log.host_rss_bytes for log in logs),
               "predicted_host_peak_bytes": predicted.peak_bytes["host"],
               "gpu_peak_bytes": max(log.gpu_peak_bytes for log in logs),
               "step_times_s": [log.step_s for log in logs]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    (args.out / "nvme_bench.json").write_text(json.dumps(
        {"model": spec.name, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
         "lean": args.lean, "disk_write_bytes_per_s": write_bw, "disk_read_bytes_per_s": read_bw,
         "disk_duplex_bytes_per_s": duplex_bw, "rows": rows}, indent=1))
    lines = [(f"{spec.name}, micro-batch {args.micro_batch} x {args.seq_len}; disk measured "
             f"(O_DIRECT): write {write_bw / 1e9:.2f} GB/s, read {read_bw / 1e9:.2f} GB/s, "
             f"both at once {duplex_bw / 1e9:.2f} GB/s"), "",
             ("| moments on NVMe | step s | predicted s | disk GB per step | host RSS GiB "
             "(predicted) |"), "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['moments_on_nvme']:.2f} | {r['step_s']:.2f} | {r['predicted_step_s']:.2f} "
              f"| {r['disk_bytes_per_step'] / 1e9:.1f} | {r['host_rss_peak_bytes'] / GIB:.1f} "
              f"({r['predicted_host_peak_bytes'] / GIB:.1f}) |" for r in rows]
    (args.out / "nvme_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
