"""Random initialisation, one block after another against a block per thread (what
Trainer.init_random does for blocks kept in RAM), side by side in one run.

    python benchmarks/probes/init_bench.py --model llama-3.2-1b --blocks 8

torch draws normals with an explicit generator on one thread, so a model's init was bound to
one core (a 3B model: ~10-16 s of a run's start); each block has its own generator, so the
threaded draw gives the same values (tests/executor/test_trainer.py checks it).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.planner.model import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--blocks", type=int, default=8, help="decoder layers to draw (RAM: fp32)")
    args = ap.parse_args()
    blocks = ModelBlocks(hf_config_from_spec(resolve_model(args.model)))
    chosen = list(range(args.blocks))
    out = {b: torch.zeros(blocks.numel(b)) for b in chosen}  # touched: no first-touch faults timed
    params = sum(blocks.numel(b) for b in chosen)

    start = time.perf_counter()
    for b in chosen:
        blocks.init_block(b, 0, out=out[b])
    serial_s = time.perf_counter() - start
    serial = {b: t.clone() for b, t in out.items()}

    threads = os.cpu_count() or 1
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda b: blocks.init_block(b, 0, out=out[b]), chosen))
    threaded_s = time.perf_counter() - start
    assert all(torch.equal(out[b], serial[b]) for b in chosen)
    print(f"{args.model}, {len(chosen)} layers, {params / 1e9:.2f} G params: one after another "
          f"{serial_s:.2f} s ({params / serial_s / 1e9:.2f} G/s), {threads} threads "
          f"{threaded_s:.2f} s ({params / threaded_s / 1e9:.2f} G/s): {serial_s / threaded_s:.2f}x")


if __name__ == "__main__":
    main()
