"""How the CPU AdamW is spread over the cores, measured where it matters: inside the executor.

One Trainer per micro-batch trains a few steps per split (LAYERSLIDE_CPU_THREADS x
LAYERSLIDE_CPU_CHUNK: threads per call, elements a thread takes at a time; 0 = OpenMP's
default / one even slice per thread), all in this one process, so every split meets the same
model, data and machine. For each split it records the step time and the AdamW rate of the
executor's own optimizer tasks (params/s from the trace), next to the same kernel measured
alone the way `layerslide calibrate` does (best of N over one array) and sustained over
block-sized arrays with both copy directions streaming. That answers two questions at once:
which split the executor should use, and which probe predicts the executor's rate.

    python benchmarks/probes/cpu_split_bench.py --out results/cpu_split [--batches 1,8]
        [--splits 0:0,0:1048576,15:0,15:1048576,14:1048576]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
import threading
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.blocks import hf_config_from_spec
from layerslide.executor.native import NativeKernels, load_kernels
from layerslide.executor.optim import OptimConfig
from layerslide.hwprofiles.units import parse_bytes
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import ExecutorKnobs, Policy, TrainSpec
from layerslide.training.trainer import Trainer

ADAMW_BYTES_PER_PARAM = 28  # read g 2, p m v 12; write p m v 12, bf16 weights 2
HUGE_PAGE_BYTES = 2 * 2**20
MADV_HUGEPAGE = 14


def transparent_hugepages() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def block_arrays(numel: int, count: int, huge_pages: bool) -> list[tuple[torch.Tensor, ...]]:
    """count blocks of (p, m, v fp32; g, w bf16), each advised onto huge pages before its first
    touch if asked (the kernel then backs whole 2 MiB runs)."""
    libc = ctypes.CDLL(None)
    arrays = []
    for _ in range(count):
        block = (torch.empty(numel), torch.empty(numel), torch.empty(numel),
                 torch.empty(numel, dtype=torch.bfloat16),
                 torch.empty(numel, dtype=torch.bfloat16))
        if huge_pages:
            for t in block:
                start = t.data_ptr()
                end = start + t.numel() * t.element_size()
                first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
                last = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
                if last > first:
                    libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                                 MADV_HUGEPAGE)
        block[0].normal_()
        block[1].zero_()
        block[2].zero_()
        block[3].copy_(block[0] * 1e-3)
        block[4].zero_()
        arrays.append(block)
    return arrays


def parse_splits(text: str) -> list[tuple[int, int]]:
    splits = []
    for item in text.split(","):
        threads, _, chunk = item.partition(":")
        splits.append((int(threads), int(chunk or 0)))
    return splits


def adamw_call(kernels: NativeKernels, p, m, v, g, w) -> None:
    kernels.adamw_step(param=p, exp_avg=m, exp_avg_sq=v, grad=g, weights_out=w,
                       decay_end=p.numel(), lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8,
                       weight_decay=0.0, grad_scale=1.0, step=1)


def calibrate_style(kernels: NativeKernels, numel: int, repeats: int) -> float:
    """Params/s as `layerslide calibrate` measures: fp32 grads, one array, best of N."""
    p, g = torch.randn(numel), torch.randn(numel) * 1e-3
    m, v = torch.zeros(numel), torch.zeros(numel)
    adamw_call(kernels, p, m, v, g, None)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        adamw_call(kernels, p, m, v, g, None)
        best = min(best, time.perf_counter() - start)
    return numel / best


class Streams:
    """Both copy directions streaming pinned buffers until stopped (what the executor's uploads
    and grad offloads do to host memory while AdamW runs)."""

    def __init__(self, nbytes: int):
        self.up_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.down_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.up_gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.down_gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self.stop = threading.Event()
        self.copied_bytes = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        up, down = torch.cuda.Stream(), torch.cuda.Stream()
        while not self.stop.is_set():
            with torch.cuda.stream(up):
                self.up_gpu.copy_(self.up_host, non_blocking=True)
            with torch.cuda.stream(down):
                self.down_host.copy_(self.down_gpu, non_blocking=True)
            up.synchronize()
            down.synchronize()
            self.copied_bytes += 2 * self.up_host.numel()

    def __enter__(self):
        self.start_s = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.rate = self.copied_bytes / (time.perf_counter() - self.start_s)


def sustained(kernels: NativeKernels, arrays, passes: int, dma_bytes: int) -> dict:
    """Params/s over block-sized arrays back to back (bf16 grads in, bf16 weights out), the
    working set far beyond the caches; with dma_bytes > 0, while both copy directions stream."""
    numel = sum(a[0].numel() for a in arrays)
    for a in arrays:
        adamw_call(kernels, *a)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(passes):
            for a in arrays:
                adamw_call(kernels, *a)
        return passes * numel / (time.perf_counter() - start)

    if dma_bytes and torch.cuda.is_available():
        with Streams(dma_bytes) as streams:
            rate = run()
        return {"params_per_s": rate, "dma_bytes_per_s": streams.rate}
    return {"params_per_s": run(), "dma_bytes_per_s": 0.0}


def executor_rates(trainer: Trainer, first_step: int) -> dict:
    """AdamW params/s of the trainer's CPU optimizer tasks from `first_step` on: the median
    task's, and all their params over their summed durations (cpu_busy_s)."""
    rates, params, busy_s = [], 0, 0.0
    for e in trainer.trace_events:
        if e.kind != "optimizer_step" or e.step < first_step or e.lane != "cpu":
            continue
        n, dur = trainer.blocks.numel(e.block), e.end_s - e.start_s
        if dur > 0:
            rates.append(n / dur)
            params += n
            busy_s += dur
    return {"median_task_params_per_s": statistics.median(rates) if rates else 0.0,
            "params_per_busy_s": params / busy_s if busy_s else 0.0,
            "cpu_busy_s": busy_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--splits", default="0:0,0:1048576,15:0,15:1048576,14:1048576,12:1048576",
                    help="THREADS:CHUNK,... (0: OpenMP's thread count / static split)")
    ap.add_argument("--steps", type=int, default=4, help="steps per split (after a warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the splits")
    ap.add_argument("--gpu-memory", default="24GiB")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--probe-blocks", type=int, default=8,
                    help="block-sized arrays for the sustained probe")
    ap.add_argument("--probes", choices=("all", "first", "none"), default="all",
                    help="measure the kernel alone for every split, the first, or none")
    ap.add_argument("--switch-intervals", default="",
                    help="GIL switch intervals the lanes run under, per split, in seconds, "
                         "e.g. 0.005,0.0002 (default: ExecutorKnobs.lane_switch_interval_s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = resolve_model(args.model)
    config = hf_config_from_spec(spec)
    splits = parse_splits(args.splits)
    cuda = args.device == "cuda"
    result = {"model": spec.name, "seq_len": args.seq_len, "threads_default":
              torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "transparent_hugepages": transparent_hugepages(), "probes": [], "runs": []}
    print(f"transparent huge pages: {result['transparent_hugepages']}", flush=True)

    # --- the kernel alone, per split ----------------------------------------------------------
    block_numel = max(spec.layer_params, 1)
    probed = {"all": splits, "first": splits[:1], "none": []}[args.probes]
    arrays = block_arrays(block_numel, args.probe_blocks, huge_pages=False) if probed else []
    for threads, chunk in probed:
        kernels = load_kernels(threads=threads, chunk=chunk)
        row = {"threads": threads, "chunk": chunk,
               "calibrate_style_params_per_s": calibrate_style(kernels, 64 * 2**20, 3),
               "sustained": sustained(kernels, arrays, 2, 0),
               "sustained_with_dma": sustained(kernels, arrays, 2, 2**30 if cuda else 0)}
        result["probes"].append(row)
        print(json.dumps(row), flush=True)
    del arrays
    if args.probes == "all":  # the first split over arrays on huge pages: does the TLB cost?
        kernels = load_kernels(threads=splits[0][0], chunk=splits[0][1])
        huge = block_arrays(block_numel, args.probe_blocks, huge_pages=True)
        result["huge_pages_probe"] = {"threads": splits[0][0], "chunk": splits[0][1],
                                      "sustained": sustained(kernels, huge, 2, 0)}
        print(json.dumps(result["huge_pages_probe"]), flush=True)
        del huge
    default_interval = ExecutorKnobs().lane_switch_interval_s
    intervals = [float(x) for x in args.switch_intervals.split(",") if x] or [default_interval]

    # --- inside the executor, per split -------------------------------------------------------
    for mb in (int(b) for b in args.batches.split(",")):
        train = TrainSpec(micro_batch=mb, seq_len=args.seq_len)
        with Trainer(config=config, plan=build_plan(spec, train, Policy.of()), device=args.device,
                     optim=OptimConfig(lr=1e-5), segment_steps=args.steps,
                     gpu_memory_bytes=parse_bytes(args.gpu_memory) if cuda else None) as trainer:
            trainer.init_random(0)
            data = SyntheticTokens(spec.vocab_size, args.seq_len)
            trainer.fit(data, 2)  # compile and first-touch everything
            native = trainer.state.native
            for round_index in range(args.rounds):
                for (threads, chunk), interval in ((s, i) for s in splits for i in intervals):
                    native.threads, native.chunk = threads, chunk
                    knobs = ExecutorKnobs(cpu_threads=threads, cpu_chunk_elements=chunk,
                                          lane_switch_interval_s=interval)
                    # the plan the next segments run: its knobs, as a plan file would say
                    trainer.plan = dataclasses.replace(trainer.plan, policy=dataclasses.replace(
                        trainer.plan.policy, executor=knobs))
                    first = trainer.step
                    logs = trainer.fit(data, args.steps)
                    row = {"micro_batch": mb, "round": round_index, "threads": threads,
                           "chunk": chunk, "switch_interval_s": interval,
                           "step_times_s": [log.step_s for log in logs],
                           "step_s": statistics.median(log.step_s for log in logs[1:]),
                           **executor_rates(trainer, first + 1)}
                    result["runs"].append(row)
                    print(json.dumps(row), flush=True)
    (args.out / "cpu_split.json").write_text(json.dumps(result, indent=1))
    print(summary(result))
    (args.out / "cpu_split.md").write_text(summary(result))


def summary(result: dict) -> str:
    batches = sorted({r["micro_batch"] for r in result["runs"]})
    probes = {(p["threads"], p["chunk"]): p for p in result["probes"]}
    lines = ["| threads:chunk | GIL switch ms | calibrate-style G params/s | sustained | "
             "sustained + DMA | " + " | ".join(f"mb{mb} step s | mb{mb} executor AdamW G/s"
                                              for mb in batches) + " |",
             "|" + " --- |" * (5 + 2 * len(batches))]
    def key(run: dict) -> tuple[int, int, float]:  # runs before the sweep existed: Python's 5 ms
        return run["threads"], run["chunk"], run.get("switch_interval_s", 0.005)

    keys = list(dict.fromkeys(key(r) for r in result["runs"]))  # in the order they ran
    for threads, chunk, interval in keys:
        probe = probes.get((threads, chunk))
        cells = [f"{threads}:{chunk}", f"{interval * 1e3:g}"]
        cells += ([f"{probe['calibrate_style_params_per_s'] / 1e9:.2f}",
                   f"{probe['sustained']['params_per_s'] / 1e9:.2f}",
                   f"{probe['sustained_with_dma']['params_per_s'] / 1e9:.2f}"]
                  if probe else ["-", "-", "-"])
        for mb in batches:
            runs = [r for r in result["runs"]
                    if r["micro_batch"] == mb and key(r) == (threads, chunk, interval)]
            cells.append(f"{statistics.median(r['step_s'] for r in runs):.3f}" if runs else "-")
            cells.append(f"{statistics.median(r['params_per_busy_s'] for r in runs) / 1e9:.2f}"
                         if runs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    huge = result.get("huge_pages_probe")
    if huge:
        lines.append(f"\nsustained over arrays advised onto huge pages ({huge['threads']}:"
                     f"{huge['chunk']}): {huge['sustained']['params_per_s'] / 1e9:.2f} G params/s; "
                     f"transparent huge pages: {result['transparent_hugepages']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
