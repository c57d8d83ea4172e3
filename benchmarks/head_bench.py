"""The LM head's loss + grads, side by side: time and peak GPU memory per method, one run.

Methods, each forward + backward of sum-reduced cross-entropy on logits = x @ w.T (bf16):
- torch: materialised logits, F.cross_entropy on their fp32 upcast, autograd;
- liger: liger-kernel's LigerFusedLinearCrossEntropyLoss (recorded "not installed" without it);
- chunked: layerslide.executor.compute.chunked_linear_cross_entropy, chunk from the planner;
- ours@C: layerslide.kernels.linear_cross_entropy.fused_linear_cross_entropy, C rows a chunk.
Time: CUDA events, a warm-up, then the median of --repeats. Memory: the peak allocated above
the inputs (x, w, labels) during one call, outputs (d_x, d_weight) included for all. A method
that runs out of memory is recorded "OOM". Writes head_bench.json and head_bench.md to --out.

    python benchmarks/head_bench.py --out benchmarks/results/head_<date>/
    python benchmarks/head_bench.py --device cpu --tiny --out /tmp/hb   # Triton interpreter
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from layerslide.executor.compute import IGNORE_INDEX, chunked_linear_cross_entropy
from layerslide.kernels.linear_cross_entropy import fused_linear_cross_entropy

# networkx comes with the package's __init__, simpy does not (checked: not on the GPU machine)
from layerslide.planner.model import ModelSpec
from layerslide.planner.sizes import fused_head_chunk_tokens

GIB = 2**30
DEFAULT_CASES = "8192x3072x128256,32768x3072x128256,65536x3072x128256,16384x4096x151936," \
                "8192x8192x128256"
TINY_CASES = "64x32x513,48x16x1000"


@dataclass(frozen=True)
class Result:
    case: str
    method: str
    status: str  # "ok", "OOM", "not installed" or "needs CUDA" (liger)
    time_ms: float | None = None
    peak_gib: float | None = None
    loss: float | None = None


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    cases = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--cases: {item!r} is not TOKENSxHIDDENxVOCAB, e.g. 8192x3072x128256")
        cases.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return cases


def planner_chunk(tokens: int, hidden: int, vocab: int) -> int:
    """The chunk the executor's plan gives the PyTorch path (it reads hidden and vocab only)."""
    spec = ModelSpec(name="head-bench", architecture="llama", num_layers=1, hidden_size=hidden,
                     intermediate_size=4 * hidden, num_attention_heads=max(1, hidden // 128),
                     num_key_value_heads=1, head_dim=128, vocab_size=vocab,
                     tie_word_embeddings=False)
    return fused_head_chunk_tokens(spec, tokens)


def measure(fn: Callable[[], torch.Tensor], device: torch.device, warmup: int,
            repeats: int) -> tuple[float, float | None, float]:
    """(median ms, peak GiB above what was allocated before, the loss of the last call)."""
    for _ in range(warmup):
        fn()
    cuda = device.type == "cuda"
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    peak = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / GIB
    else:
        loss = fn()
    return statistics.median(times), peak, float(loss)


def methods(x, w, labels, scale, chunks: list[int], chunk_torch: int, block: int | None):
    """name -> a call returning the loss (its grads made and dropped), or a status string."""
    def torch_materialised():
        x_, w_ = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        loss = F.cross_entropy((x_ @ w_.T).float(), labels, ignore_index=IGNORE_INDEX,
                               reduction="sum")
        (loss * scale).backward()
        return loss.detach()

    out: dict[str, Callable[[], torch.Tensor] | str] = {"torch": torch_materialised}
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        out["liger"] = "not installed"
    else:
        if x.device.type != "cuda":
            out["liger"] = "needs CUDA"
        else:
            liger_loss = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX,
                                                          reduction="sum")

            def liger():
                x_, w_ = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
                loss = liger_loss(w_, x_, labels)
                loss = loss[0] if isinstance(loss, tuple) else loss  # newer: (loss, z_loss)
                (loss * scale).backward()
                return loss.detach()

            out["liger"] = liger
    out[f"chunked@{chunk_torch}"] = lambda: chunked_linear_cross_entropy(
        x, w, labels, scale, chunk_torch)[0]
    for chunk in chunks:
        out[f"ours@{chunk}"] = lambda chunk=chunk: fused_linear_cross_entropy(
            x, w, labels, scale, chunk, block=block)[0]
    return out


def run_case(tokens: int, hidden: int, vocab: int, args, device: torch.device) -> list[Result]:
    case = f"{tokens}x{hidden}x{vocab}"
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(args.dtype)
    w = (torch.randn(vocab, hidden, generator=gen, device=device) / hidden**0.5).to(args.dtype)
    labels = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    labels[::8] = IGNORE_INDEX  # as the last token of each sequence is
    scale = torch.tensor(1.0 / tokens, device=device)
    chunks = sorted({min(c, tokens) for c in args.chunks})
    results = []
    for name, fn in methods(x, w, labels, scale, chunks, planner_chunk(tokens, hidden, vocab),
                            args.block).items():
        if isinstance(fn, str):
            results.append(Result(case, name, fn))
        else:
            try:
                ms, peak, loss = measure(fn, device, args.warmup, args.repeats)
                results.append(Result(case, name, "ok", ms, peak, loss))
            except torch.cuda.OutOfMemoryError:
                results.append(Result(case, name, "OOM"))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {case} {results[-1].method:>14}: {fmt(results[-1])}", flush=True)
    return results


def fmt(r: Result) -> str:
    if r.status != "ok":
        return r.status
    mem = "" if r.peak_gib is None else f", peak {r.peak_gib:.2f} GiB"
    return f"{r.time_ms:.2f} ms{mem}, loss {r.loss:.6g}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def summarise(results: list[Result]) -> list[dict]:
    """Per case and each of our chunks: time vs torch, liger and chunked, memory vs torch."""
    rows = []
    for case in dict.fromkeys(r.case for r in results):
        by = {r.method: r for r in results if r.case == case and r.status == "ok"}
        chunked = next((r for m, r in by.items() if m.startswith("chunked")), None)
        for name, ours in by.items():
            if not name.startswith("ours"):
                continue
            ref = {k: by.get(k) for k in ("torch", "liger")}
            rows.append({
                "case": case, "method": name,
                "time_vs_torch": ratio(ours.time_ms, ref["torch"] and ref["torch"].time_ms),
                "time_vs_liger": ratio(ours.time_ms, ref["liger"] and ref["liger"].time_ms),
                "time_vs_chunked": ratio(ours.time_ms, chunked and chunked.time_ms),
                "peak_vs_torch": ratio(ours.peak_gib, ref["torch"] and ref["torch"].peak_gib),
                "loss_rel_diff_vs_chunked": ratio(abs(ours.loss - chunked.loss), abs(chunked.loss))
                if chunked else None,
            })
    return rows


def markdown(results: list[Result], summary: list[dict], meta: dict) -> str:
    def cell(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    lines = [f"# LM head loss + grads ({meta['date']}, {meta['device_name']})", "",
             f"`{meta['command']}`", "",
             (f"torch {meta['torch']}, triton {meta['triton']}, dtype {meta['dtype']}, "
              f"median of {meta['repeats']} after {meta['warmup']} warm-up; peak = allocated "
              "above the inputs, outputs included."), "",
             "| case | method | status | time ms | peak GiB |", "|---|---|---|---:|---:|"]
    lines += [f"| {r.case} | {r.method} | {r.status} | {cell(r.time_ms, '.2f')} | "
              f"{cell(r.peak_gib, '.2f')} |" for r in results]
    lines += ["", "Ratios (ours / other; < 1: ours faster or smaller):", "",
              ("| case | ours | time / torch | time / liger | time / chunked | peak / torch "
               "| loss rel. diff vs chunked |"), "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {s['case']} | {s['method']} | {cell(s['time_vs_torch'])} | "
              f"{cell(s['time_vs_liger'])} | {cell(s['time_vs_chunked'])} | "
              f"{cell(s['peak_vs_torch'])} | {cell(s['loss_rel_diff_vs_chunked'], '.1e')} |"
              for s in summary]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and .md")
    parser.add_argument("--cases", default=None,
                        help=f"TOKENSxHIDDENxVOCAB,... (default {DEFAULT_CASES})")
    parser.add_argument("--chunks", default=None,
                        help="chunk_tokens values for ours (default 1024,2048,4096,8192)")
    parser.add_argument("--block", type=int, default=None,
                        help="vocab columns per kernel step (default: the launcher's choice)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (default 5)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed calls first (default 2)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a smoke test under Triton's interpreter, no timing worth it")
    parser.add_argument("--tiny", action="store_true",
                        help=f"defaults for a smoke run: cases {TINY_CASES}, chunks 16,32, "
                        "block 64, 1 repeat, no warm-up")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args(argv)
    # the interpreter reduces a block element by element: tiny runs take a small one
    defaults = ({"cases": TINY_CASES, "chunks": "16,32", "block": 64, "repeats": 1, "warmup": 0}
                if args.tiny else {"cases": DEFAULT_CASES, "chunks": "1024,2048,4096,8192",
                                   "block": None, "repeats": 5, "warmup": 2})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.chunks = [int(c) for c in args.chunks.split(",")]
    args.dtype = getattr(torch, args.dtype)
    cases = parse_cases(args.cases)
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel is first used
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on the GPU machine, or --device cpu --tiny")
    results = []
    for tokens, hidden, vocab in cases:
        results += run_case(tokens, hidden, vocab, args, device)
    summary = summarise(results)
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "device_name": torch.cuda.get_device_name() if device.type == "cuda"
            else f"CPU ({platform.processor() or platform.machine()}, Triton interpreter)",
            "torch": torch.__version__, "triton": triton.__version__,
            "dtype": str(args.dtype).removeprefix("torch."), "repeats": args.repeats,
            "warmup": args.warmup, "block": args.block}
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "results": [asdict(r) for r in results], "ratios": summary}
    (args.out / "head_bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    text = markdown(results, summary, meta)
    (args.out / "head_bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
