"""Which ops of a decoder layer's passes make the host wait for the GPU (issue 26).

layer_dispatch_probe found Qwen3-4B's recompute + backward enqueued in as much host time as
its GPU time (2.42 / 2.42 ms at 1024 tokens, 4.62 / 4.54 at 4096), where Llama-3.2-3B's and
Mistral-7B's enqueue in 2.4-2.8 ms whatever their GPU time. That is what a synchronising op
inside the pass would do, and it would keep the executor's GPU thread from running ahead.
Each layer is called as the executor calls it, once forward and once recompute + backward,
under torch.cuda.set_sync_debug_mode("warn"): every op that synchronises is recorded with the
frames of this repository and of transformers it came from. CUDA only.

    python benchmarks/probes/sync_probe.py --models qwen3-4b llama-3.2-3b --out R/sync.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_dispatch_probe import build
from layer_kernels_bench import layer_calls

FRAMES_OF = ("layerslide", "transformers", "benchmarks")


def synchronising_sites(call) -> list[dict]:
    """The ops `call` synchronises in: the warning and the frames of interest, each once."""
    sites, stacks = {}, []

    def keep(message, category, filename, lineno, file=None, line=None):
        stacks.append((str(message), traceback.format_stack()))

    torch.cuda.synchronize()
    with warnings.catch_warnings():  # restores showwarning on the way out
        warnings.simplefilter("always")
        warnings.showwarning = keep
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for message, stack in stacks:
        if "synchroniz" not in message.lower():
            continue
        frames = [f.strip().splitlines()[0] for f in stack if any(k in f for k in FRAMES_OF)]
        key = (message, tuple(frames[-4:]))
        sites.setdefault(key, {"message": message, "frames": frames[-4:], "count": 0})
        sites[key]["count"] += 1
    return list(sites.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-4b", "llama-3.2-3b"])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--kernels", default="compiled", choices=("compiled", "eager"))
    ap.add_argument("--into-sum", action="store_true", help="as a layer-major sweep runs it")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sync_probe needs a CUDA device: set_sync_debug_mode watches CUDA syncs")
    device = torch.device("cuda")
    results = []
    for model in args.models:
        spec, layer, rotary, fn = build(model, device, args.kernels, args.into_sum)
        x = torch.randn(1, args.tokens, spec.hidden_size, device=device, dtype=torch.bfloat16)
        rope = rotary(x[:1, :1], torch.arange(args.tokens, device=device)[None])
        forward, backward = layer_calls(fn, layer, x, torch.randn_like(x), rope)
        forward()  # compiled: the graphs are made before anything is watched
        backward()
        row = {"model": model, "tokens": args.tokens, "kernels": args.kernels,
               "into_sum": args.into_sum, "forward": synchronising_sites(forward),
               "backward": synchronising_sites(backward)}
        print(model, "forward:", len(row["forward"]), "sites; backward:", len(row["backward"]))
        results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
