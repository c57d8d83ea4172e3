"""Which ops of a decoder layer's passes make the host wait for the GPU (issue 26).

In training, Qwen3-4B's layer-major backward tasks ran 5.6-8.1 ms against 4.7 predicted, and
the layer_dispatch_probe runs disagree on whether its enqueue waits for the GPU: into fp32 sums
it took 5.13 ms of host time beside 5.15 of GPU at 4096 tokens (validation_2026-12-04 call1),
where the plain pass took 3.19 against 4.52 (validation_2026-12-03b call4) and 4.62 against 4.54
(call3). A synchronising op inside the pass would keep the executor's GPU thread from running
ahead. Each layer is called as the executor calls it, forward then recompute + backward, under
torch.profiler. Every CUDA runtime call that blocks the host (a stream, event or device
synchronize; a synchronous copy) is reported with the ops that enclose it: autograd runs the
backward's nodes in its own thread, so a Python stack would only name `backward()`. CUDA only.

    python benchmarks/probes/sync_probe.py --models qwen3-4b llama-3.2-3b --out R/sync.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the layer bench
sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_dispatch_probe import build
from layer_kernels_bench import layer_calls

BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                  "cudaMemcpy", "cudaFree", "cudaMalloc")  # cudaMemcpy, not cudaMemcpyAsync
ENCLOSING_OPS = 4


def blocking_calls(call) -> list[dict]:
    """The host-blocking CUDA runtime calls `call` makes, by name and enclosing ops, counted."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    found = Counter()
    for event in prof.events():
        if event.name not in BLOCKING_CALLS:  # exact: the Async variants do not block
            continue
        chain, parent = [], event.cpu_parent
        while parent is not None and len(chain) < ENCLOSING_OPS:
            chain.append(parent.name)
            parent = parent.cpu_parent
        found[(event.name, tuple(chain))] += 1
    return [{"call": name, "inside": list(chain), "count": n}
            for (name, chain), n in found.most_common()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-4b", "llama-3.2-3b"])
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--kernels", default="compiled", choices=("compiled", "eager"))
    ap.add_argument("--into-sum", action="store_true", help="as a layer-major sweep runs it")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sync_probe needs a CUDA device: it reports CUDA runtime calls")
    device = torch.device("cuda")
    results = []
    for model in args.models:
        spec, layer, rotary, fn = build(model, device, args.kernels, args.into_sum)
        x = torch.randn(args.micro_batch, args.seq_len, spec.hidden_size, device=device,
                        dtype=torch.bfloat16)
        rope = rotary(x[:1, :1], torch.arange(args.seq_len, device=device)[None])
        forward, backward = layer_calls(fn, layer, x, torch.randn_like(x) * 1e-3, rope)
        forward()  # compiled: the graphs are made before anything is watched
        backward()
        row = {"model": model, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
               "kernels": args.kernels, "into_sum": args.into_sum,
               "forward": blocking_calls(forward), "backward": blocking_calls(backward)}
        print(model, "forward:", row["forward"], "backward:", row["backward"], flush=True)
        results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
