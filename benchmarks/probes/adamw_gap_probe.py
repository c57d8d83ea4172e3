"""Why does the executor's CPU AdamW run faster than calibrate's test of it? On the H200 machine
(validation_2026-12-03c) the training rows' AdamW tasks that overlapped no copy and no GPU work
ran 5.6-6.0 Gparam/s (8B embedding, 525 M params; 8B layers, 218 M), where calibrate's test in
the same lease read 4.89 at 256 Mi blocks and adamw_block_probe 5.0 at 262-394 M. One process,
the variants taking turns round by round (the machine drifts), on blocks of --params:

- calibrate: the executor's call as calibrate.host.executor_adamw_block makes it, on
  ADAMW_ARRAYS blocks (the new weights overwrite the grads, so from the second call on the
  "grads" are weights of magnitude ~1);
- fresh_grads: the same with grads of training's magnitude copied in before each call (untimed);
- fresh_weights: its control, values of the weights' magnitude copied in alike (the copy
  leaves part of the buffer in the caches either way);
- landed_by_dma: the grads land from the GPU into a page-locked buffer before each call, as
  the executor's offload does (untimed; CUDA only);
- model_sized: MODEL_BLOCKS blocks stepped in turn, as a 7-8B model's state spans ~25 GB.

Per variant the median call, its rate and the ratio to calibrate's. The kernel's threads and
chunk are calibrate's (the LAYERSLIDE_* knobs). All variants are held at once: at the default
--params about 60 GB of RAM. Writes JSON to --out.
    python benchmarks/probes/adamw_gap_probe.py --out R/adamw_gap.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from layerslide.calibrate import ADAMW_ARRAYS
from layerslide.calibrate.host import _kernel_knobs, repeated_randn
from layerslide.executor.moments import Moments
from layerslide.executor.native import load_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adamw_block_probe import timed_calls

MODEL_BLOCKS = 8
CALLS_PER_ROUND = 4


class Block:
    """One block's state as the executor holds it; `prepare` runs untimed before each call."""

    def __init__(self, native, numel: int, landing: str):
        self.native, self.numel = native, numel
        self.param, self.moments = repeated_randn(numel), Moments.zeros("fp32", numel)
        self.landed = repeated_randn(numel, 1e-3, torch.bfloat16)
        self.grads = None
        if landing == "fresh_grads":
            self.grads = repeated_randn(numel, 1e-3, torch.bfloat16)
        elif landing == "fresh_weights":
            self.grads = repeated_randn(numel, 1.0, torch.bfloat16)
        elif landing == "landed_by_dma":
            err = torch.cuda.cudart().cudaHostRegister(self.landed.data_ptr(), 2 * numel, 0)
            if int(err) != 0:  # unregistered, the copy would go through staging instead
                raise RuntimeError(f"cudaHostRegister failed ({err}): raise ulimit -l")
            self.grads = repeated_randn(numel, 1e-3, torch.bfloat16).cuda()

    def prepare(self) -> None:
        if self.grads is not None:
            self.landed.copy_(self.grads, non_blocking=True)
            if self.grads.is_cuda:
                torch.cuda.synchronize()

    def step(self) -> None:
        self.native.adamw_step_moments(
            param=self.param, moments=self.moments, grad=self.landed, weights_out=self.landed,
            decay_end=self.numel, lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
            grad_scale=1.0, step=1)

    def close(self) -> None:
        if self.grads is not None and self.grads.is_cuda:
            torch.cuda.cudart().cudaHostUnregister(self.landed.data_ptr())


def prepared_calls(blocks: list[Block], calls: int) -> list[float]:
    """Seconds of each call, the untimed preparation before it."""
    out = []
    for i in range(calls):
        block = blocks[i % len(blocks)]
        block.prepare()
        out += timed_calls([block.step], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=int, default=218_112_000, help="a block (8B's layer)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    native = load_kernels(**_kernel_knobs())
    if native is None:
        parser.error("no native kernels here (no C compiler, or LAYERSLIDE_NATIVE=0)")
    kinds = ["calibrate", "fresh_grads", "fresh_weights"]
    kinds += ["landed_by_dma"] if torch.cuda.is_available() else []
    variants = {kind: [Block(native, args.params, kind) for _ in range(ADAMW_ARRAYS)]
                for kind in kinds}
    variants["model_sized"] = [Block(native, args.params, "calibrate")
                               for _ in range(MODEL_BLOCKS)]
    for blocks in variants.values():  # first touch
        prepared_calls(blocks, len(blocks))
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for r in range(args.rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name] += prepared_calls(variants[name], CALLS_PER_ROUND)
    for blocks in variants.values():
        for block in blocks:
            block.close()
    base = statistics.median(times["calibrate"])
    found = {"params": args.params, "threads": torch.get_num_threads(), "rounds": args.rounds,
             "variants": {name: {"median_s": statistics.median(t),
                                 "rate_params_per_s": args.params / statistics.median(t),
                                 "vs_calibrate": base / statistics.median(t),
                                 "calls_s": t} for name, t in times.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1))
    for name, row in found["variants"].items():
        print(f"{name:14s} median {row['median_s'] * 1e3:7.2f} ms  "
              f"{row['rate_params_per_s'] / 1e9:.2f} Gparam/s  x{row['vs_calibrate']:.3f}")


if __name__ == "__main__":
    main()
