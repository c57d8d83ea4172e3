"""layerslide against DeepSpeed ZeRO-3 CPU offload and all-GPU PyTorch, side by side: same HF
model shape, synthetic tokens, sequence length and micro-batch; each run in a fresh process.

    python benchmarks/compare_offload.py --out results/compare            # the whole matrix
    python benchmarks/compare_offload.py --system deepspeed --micro-batch 8 --one   # one run

Systems:
  layerslide  the executor, default policy, GPU capped at --gpu-memory
  layerslide-tuned  the executor with `layerslide tune`'s pick for the micro-batch on --profile
              under 90% of --gpu-memory (not in the default --systems)
  deepspeed   ZeRO-3, parameters and optimizer offloaded to pinned CPU memory (DeepSpeedCPUAdam),
              per-layer activation checkpointing, bf16; GPU capped at --gpu-memory
  torch       all on the GPU, uncapped (the no-offload reference): fp32 weights, bf16 autocast,
              per-layer activation checkpointing, torch's fused CUDA AdamW
Records s/step (median after the warm-up steps), tokens/s, model TFLOP/s, peak GPU memory
(allocated and reserved) and peak host RSS; writes compare.csv, compare.md and compare.png.
A run whose RSS passes --host-limit is stopped and recorded as needing more host memory.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GIB = 2**30
SYSTEMS = ("layerslide", "layerslide-tuned", "deepspeed", "torch")
DEFAULT_SYSTEMS = ("layerslide", "deepspeed", "torch")


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


def hf_model(spec, dtype, device: str | None = None):
    """The HF causal LM of a planner preset, random weights, per-layer checkpointing; built on
    `device`, or where the surrounding context puts parameters (DeepSpeed's zero.Init)."""
    import contextlib

    import torch
    from transformers import AutoModelForCausalLM

    from layerslide.executor.blocks import hf_config_from_spec

    config = hf_config_from_spec(spec)
    config._attn_implementation = "sdpa"
    with torch.device(device) if device else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def step_times_torch(spec, mb: int, seq: int, steps: int, device: str) -> list[float]:
    import torch

    model = hf_model(spec, torch.float32, device).train()
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


def step_times_deepspeed(spec, mb: int, seq: int, steps: int, cap: int,
                         device: str) -> list[float]:
    import deepspeed
    import torch

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    cuda = device.startswith("cuda")
    if cuda:
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
    deepspeed.init_distributed(dist_backend=None if cuda else "gloo")  # CPU: smoke tests
    # zero.Init patches torch.Tensor.__new__; torch._dynamo, which transformers' model modules
    # import lazily, refuses to load under that patch: load them all before entering it
    import importlib

    import torch._dynamo

    importlib.import_module(f"transformers.models.{spec.architecture}"
                            f".modeling_{spec.architecture}")
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = hf_model(spec, torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config)
    # ZeRO-3 wraps the optimizer it built; with offload_optimizer that is DeepSpeedCPUAdam
    print(f"optimizer: {type(getattr(engine.optimizer, 'optimizer', engine.optimizer)).__name__}",
          flush=True)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, spec.vocab_size, (mb, seq), device=engine.device)
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def step_times_layerslide(spec, mb: int, seq: int, steps: int, cap: int, device: str,
                          tuned_on: str | None = None,
                          tune_budget: int | None = None) -> list[float]:
    """tuned_on: a profile to take tune's pick from (as validate_sim does), under tune_budget
    bytes of GPU memory (default: 0.9 of the cap), else Policy.of()."""
    from layerslide.data.sources import SyntheticTokens
    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.executor.optim import OptimConfig
    from layerslide.planner.build import build_plan
    from layerslide.planner.settings import Policy, TrainSpec
    from layerslide.training.trainer import Trainer

    train = TrainSpec(micro_batch=mb, seq_len=seq)
    policy = Policy.of()
    if tuned_on is not None:
        from layerslide.hwprofiles import load_profile
        from layerslide.planner import sizes
        from layerslide.tuner import SearchSpace, tune

        best = tune(spec, load_profile(tuned_on), seq_len=seq, base_policy=policy,
                    space=SearchSpace(micro_batches=(mb,), allow_nvme=False),
                    # a budget of allocations, as DeepSpeed's is measured: tune's GPU limit
                    # also holds the CUDA context and workspaces (the plan's runtime bytes)
                    gpu_memory_bytes=(min(tune_budget + sizes.GPU_RUNTIME_BYTES, cap)
                                      if tune_budget else int(0.9 * cap))).best
        if best is None:
            raise SystemExit(f"tune finds no policy for micro-batch {mb} under the cap")
        policy = best.policy
        print(f"policy: {json.dumps(policy.to_dict())}", flush=True)
    with Trainer(config=hf_config_from_spec(spec), plan=build_plan(spec, train, policy),
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
        times = step_times_deepspeed(spec, args.micro_batch, args.seq_len, args.steps, cap,
                                     args.device)
    else:
        times = step_times_layerslide(spec, args.micro_batch, args.seq_len, args.steps, cap,
                                      args.device, args.profile if "tuned" in args.system
                                      else None, args.tune_budget)
    step_s = statistics.median(times[2:] or times[-1:])
    tokens = args.micro_batch * args.seq_len
    return {"system": args.system, "model": spec.name, "micro_batch": args.micro_batch,
            "seq_len": args.seq_len, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops": spec.training_flops_per_token(args.seq_len) * tokens / step_s / 1e12,
            "gpu_allocated_peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
            "gpu_reserved_peak_bytes": torch.cuda.max_memory_reserved() if cuda else 0,
            "host_rss_peak_bytes": rss.stop(), "step_times_s": times}


def _ratio(mine: dict, other: dict, key: str) -> str:
    return f"{mine[key] / other[key]:.2f}x" if other[key] else "n/a"


def host_memory_floor_s(row: dict, profile_path: Path) -> float:
    """The least step time of the row's layerslide plan that the host's memory bandwidth
    allows on this machine's profile: AdamW's and every copy's bytes over the bandwidth
    (simulate's 'host_memory' floor; the default step at 3B is bound by it)."""
    from layerslide.hwprofiles import load_profile
    from layerslide.planner import build_plan
    from layerslide.planner.model import resolve_model
    from layerslide.planner.settings import Policy, TrainSpec
    from layerslide.simulator import simulate

    policy = Policy.from_dict(json.loads(row["policy"])) if row.get("policy") else Policy.of()
    train = TrainSpec(micro_batch=row["micro_batch"], seq_len=row["seq_len"])
    prediction = simulate(build_plan(resolve_model(row["model"]), train, policy, num_steps=3),
                          load_profile(profile_path))
    return prediction.floors_s.get("host_memory", 0.0)


def write_report(rows: list[dict], out: Path, floor_profile: Path | None = None) -> None:
    """compare.csv (every run), compare.md (table, then layerslide against DeepSpeed at each
    micro-batch with the issue's targets and, with floor_profile, the most this machine's host
    memory lets the plan reach) and compare.png (the matrix model vs micro-batch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fields = ["system", "model", "micro_batch", "seq_len", "step_s", "tokens_per_s",
              "model_tflops", "gpu_allocated_peak_bytes", "gpu_reserved_peak_bytes",
              "host_rss_peak_bytes", "optimizer", "policy", "error"]
    with open(out / "compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [("| system | model | micro-batch | s/step | tokens/s | TFLOP/s | GPU alloc GiB | "
              "GPU reserved GiB | host RSS GiB |"), "|" + " --- |" * 9]
    for r in rows:
        head = f"| {r['system']} | {r['model']} | {r['micro_batch']} |"
        if "error" in r:
            lines.append(f"{head} {r['error']} | | | | | |")
            continue
        lines.append(f"{head} {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['model_tflops']:.1f} | {r['gpu_allocated_peak_bytes'] / GIB:.1f} | "
                     f"{r['gpu_reserved_peak_bytes'] / GIB:.1f} | "
                     f"{r['host_rss_peak_bytes'] / GIB:.1f} |")
    ok = {(r["system"], r["model"], r["micro_batch"]): r for r in rows if "error" not in r}
    lines += ["", ("layerslide / DeepSpeed at the same micro-batch (targets: tokens/s >= 3x at "
              "micro-batch <= 8 and >= 1.5x at every one; GPU <= 0.5x; host RSS <= 0.6x):"), ""]
    for (system, model, mb), r in sorted(ok.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        ds = ok.get(("deepspeed", model, mb))
        if system.startswith("layerslide") and ds is not None:
            bound = ""
            if floor_profile is not None:
                floor = host_memory_floor_s(r, floor_profile)
                bound = (f" (host-memory floor of its plan {floor:.3f} s/step: at most "
                         f"{ds['step_s'] / floor:.2f}x here)") if floor else ""
            if r.get("tune_budget_bytes"):
                bound += f" (tuned under {r['tune_budget_bytes'] / GIB:.2f} GiB of allocations)"
            lines.append(f"- {system}, {model} micro-batch {mb}: tokens/s "
                         f"{_ratio(r, ds, 'tokens_per_s')}{bound}, GPU allocated "
                         f"{_ratio(r, ds, 'gpu_allocated_peak_bytes')}, host RSS "
                         f"{_ratio(r, ds, 'host_rss_peak_bytes')}")
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    model = rows[0]["model"]
    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    panels = (("tokens_per_s", "tokens/s", 1.0), ("gpu_allocated_peak_bytes", "GPU GiB", 1 / GIB),
              ("host_rss_peak_bytes", "host RSS GiB", 1 / GIB))
    for k, (key, label, scale) in enumerate(panels):
        ax = fig.add_subplot(1, 3, k + 1)
        for system in SYSTEMS:
            mine = sorted((mb, r[key] * scale) for (name, m, mb), r in ok.items()
                          if name == system and m == model)
            if mine:
                ax.plot(*zip(*mine, strict=True), marker="o", label=system)
        ax.set(xscale="log", xlabel="micro-batch", ylabel=label, title=model)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    print("\n".join(lines))


def rss_bytes(pid: int) -> int:
    """Resident bytes of process pid (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0


def run_watched(cmd: list[str], timeout: float, host_limit: int) -> tuple[int, str, str, str]:
    """(exit code, stdout, stderr, why it was stopped or ""): cmd in a fresh process, killed at
    the timeout or when its RSS passes host_limit bytes (0: no limit), so that a system that
    needs more RAM than the machine has is recorded as such instead of taking the machine down."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # its own process group: a stop takes its helpers (compile workers) along with it
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        start, stopped = time.monotonic(), ""
        try:
            while child.poll() is None:
                if time.monotonic() - start > timeout:
                    stopped = f"timed out after {timeout:.0f} s"
                elif host_limit and rss_bytes(child.pid) > host_limit:
                    stopped = f"host memory over {host_limit / GIB:.1f} GiB"
                if stopped:
                    break
                time.sleep(0.2)
        finally:  # stopped, or this process interrupted: leave nothing running on the GPU
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        out.seek(0)
        err.seek(0)
        return child.returncode, out.read(), err.read(), stopped


def child_row(args, system: str, model: str, mb: int, timeout: float,
              deadline_cut: bool = False, tune_budget: int | None = None) -> dict:
    """Run one configuration in a fresh process: its row, or a row saying why it has none."""
    child = [sys.executable, __file__, "--one", "--system", system, "--micro-batch", str(mb),
             "--model", model, "--seq-len", str(args.seq_len), "--steps", str(args.steps),
             "--gpu-memory", args.gpu_memory, "--device", args.device, "--profile", args.profile]
    if tune_budget:
        child += ["--tune-budget", str(tune_budget)]
    failed = {"system": system, "model": model, "micro_batch": mb, "seq_len": args.seq_len}
    code, stdout, stderr, stopped = run_watched(child, timeout, host_limit_bytes(args.host_limit))
    if stopped.startswith("timed out") and deadline_cut:
        stopped = f"cut by --deadline after {timeout:.0f} s"
    if stopped:
        print(f"  {stopped}", flush=True)
        return {**failed, "error": stopped}
    row = next((json.loads(line[4:]) for line in stdout.splitlines()
                if line.startswith("ROW ")), None)
    if row is not None:
        notes = {key: line[len(key) + 2:] for line in stdout.splitlines()
                 for key in ("optimizer", "policy") if line.startswith(f"{key}: ")}
        return {**row, **notes}
    if "OutOfMemoryError" in stderr or "CUDA out of memory" in stderr:
        reason = "out of GPU memory"
    elif code in (-9, 137):
        reason = "killed (host out of memory)"
    else:
        reason = f"exit {code}"
    print(f"  {reason}: {stderr.strip()[-400:]}", flush=True)
    return {**failed, "error": reason}


def host_limit_bytes(text: str) -> int:
    from layerslide.hwprofiles.units import parse_bytes as parse

    return 0 if text == "0" else parse(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"of {', '.join(SYSTEMS)}")
    ap.add_argument("--profile", default="h200-bench",
                    help="hardware profile layerslide-tuned takes tune's pick on")
    ap.add_argument("--system", choices=SYSTEMS, help="with --one: the system to run")
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--micro-batches", default="8,1,4,16,32",
                    help="in run order (the anchor, micro-batch 8, first)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--extra", default="",
                    help="more runs after the matrix, SYSTEM:MODEL:MICRO_BATCH comma-separated "
                         "(the largest model each system trains)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gpu-memory", default="24GiB")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--host-limit", default="0",
                    help="stop a run whose RSS passes this (e.g. 115GiB) and record it as "
                         "needing more host memory; 0: no limit")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds for the whole matrix; runs that would start later are skipped "
                         "so that the report is still written (0: none)")
    ap.add_argument("--floor-profile", type=Path,
                    help="this machine's calibrated profile: the report gives each layerslide "
                         "row's host-memory floor and the ratio it allows")
    ap.add_argument("--tune-share-of-deepspeed", type=float, default=0.0,
                    help="layerslide-tuned takes tune's pick under this share of DeepSpeed's GPU "
                         "allocation at the same micro-batch, where DeepSpeed ran before it "
                         "(list deepspeed first in --systems; e.g. 0.5, the issue's target)")
    ap.add_argument("--tune-budget", type=int, help=argparse.SUPPRESS)  # bytes, for --one
    ap.add_argument("--one", action="store_true", help="run --system once, print its row")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.one:
        print("ROW " + json.dumps(run_one(args)), flush=True)
        return
    if args.out is None:
        ap.error("--out is required")
    runs = [(system, args.model, int(mb)) for mb in args.micro_batches.split(",")
            for system in args.systems.split(",")]
    unknown = [name for name in args.systems.split(",") if name not in SYSTEMS]
    if unknown:
        ap.error(f"--systems: unknown {unknown}; known: {', '.join(SYSTEMS)}")
    for item in filter(None, args.extra.split(",")):
        system, model, mb = item.split(":")
        if system not in SYSTEMS:
            ap.error(f"--extra {item!r}: system must be one of {', '.join(SYSTEMS)}")
        runs.append((system, model, int(mb)))
    args.out.mkdir(parents=True, exist_ok=True)
    start, rows = time.monotonic(), []
    for system, model, mb in runs:
        left = args.deadline - (time.monotonic() - start) if args.deadline else args.timeout
        if args.deadline and left < 30:
            print(f"{system} {model} micro-batch {mb}: skipped, the deadline is reached",
                  flush=True)
            continue
        budget = None
        if system == "layerslide-tuned" and args.tune_share_of_deepspeed:
            ds = next((r for r in rows if r["system"] == "deepspeed" and r["model"] == model
                       and r["micro_batch"] == mb and "error" not in r), None)
            if ds is not None:
                budget = int(args.tune_share_of_deepspeed * ds["gpu_allocated_peak_bytes"])
            else:
                print(f"  no DeepSpeed row at micro-batch {mb} before it: tuned under 0.9 of "
                      "the cap instead", flush=True)
        print(f"{system} {model} micro-batch {mb}"
              + (f" (tuned under {budget / GIB:.2f} GiB)" if budget else ""), flush=True)
        row = child_row(args, system, model, mb, min(args.timeout, left),
                        deadline_cut=left < args.timeout, tune_budget=budget)
        if budget:
            row["tune_budget_bytes"] = budget
        rows.append(row)
        if "error" not in row:
            print(f"  {row['step_s']:.3f} s/step, {row['tokens_per_s']:,.0f} tokens/s, "
                  f"GPU {row['gpu_allocated_peak_bytes'] / GIB:.1f} GiB, "
                  f"host {row['host_rss_peak_bytes'] / GIB:.1f} GiB", flush=True)
        (args.out / "compare.json").write_text(json.dumps(rows, indent=1))
    if rows:
        write_report(rows, args.out, args.floor_profile)


if __name__ == "__main__":
    main()
