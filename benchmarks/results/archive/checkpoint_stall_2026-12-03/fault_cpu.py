"""Why checkpoint copies go into kept memory: one 2 GiB fp32 tensor copied on the copy threads
(checkpoint_snapshot._parallel_copy) into fresh memory (torch.empty, and the page-aligned
buffers the copies use) against memory already touched; GB/s of copied data, median of 3."""

import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from layerslide.executor.checkpoint_snapshot import (
    _parallel_copy,
    default_copy_threads,
    page_aligned_like,
)

N = 512 * 2**20
src = torch.ones(N)
rates = {"fresh torch.empty": [], "fresh page-aligned": [], "touched": []}
touched = torch.zeros(N)
with ThreadPoolExecutor(default_copy_threads()) as pool:
    for _ in range(3):
        for kind, make in (("fresh torch.empty", lambda: torch.empty(N)),
                           ("fresh page-aligned", lambda: page_aligned_like(src)),
                           ("touched", lambda: touched)):
            dst = make()
            start = time.perf_counter()
            _parallel_copy(src, dst, pool)
            rates[kind].append(N * 4 / (time.perf_counter() - start) / 1e9)
            del dst
result = {"copy_threads": default_copy_threads(),
          "gb_per_s": {k: round(statistics.median(v), 2) for k, v in rates.items()}}
print(json.dumps(result))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
