"""Does the CPU AdamW, the step's bottleneck at 3B, run faster on huge pages, and does the array
size `calibrate --quick` uses (16 Mi params) understate it? One run, side by side:

- the executor's native AdamW (28 B/param) over 4 blocks in turn, sustained rate, for block sizes
  16 Mi, 64 Mi and 100 Mi params (3B's decoder layer), on ordinary pages and on pages the kernel
  was asked to back with transparent huge pages (madvise MADV_HUGEPAGE before first touch);
- the same with both copy engines streaming pinned buffers at once (as in a training step);
- the machine's THP settings and how many huge pages each variant got (AnonHugePages).

Writes JSON to --out. Runs on the CPU alone too (the DMA rows are skipped without CUDA).
    python benchmarks/probes/adamw_pages_probe.py --out R/adamw_pages.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import torch

from layerslide.calibrate.gpu import CopyEngines
from layerslide.calibrate.host import sustained_rate
from layerslide.executor.native import load_kernels

MADV_HUGEPAGE = 14
HUGE = 2 * 2**20
MI = 2**20


def read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        return f"unreadable: {err}"


def anon_huge_bytes() -> int:
    for line in read("/proc/meminfo").splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return -1


def buffer(numel: int, dtype: torch.dtype, huge: bool) -> torch.Tensor:
    """numel elements starting on a 2 MiB boundary; with huge, madvised before first touch."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(numel * size + HUGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE
    view = raw[start:start + numel * size]
    if huge:
        libc = ctypes.CDLL(None, use_errno=True)
        length = (numel * size + HUGE - 1) // HUGE * HUGE
        if libc.madvise(ctypes.c_void_p(view.data_ptr()), ctypes.c_size_t(length),
                        MADV_HUGEPAGE) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_HUGEPAGE) failed")
    return view.view(dtype)  # a view shares raw's storage, which it keeps alive


def blocks(native, numel: int, huge: bool, count: int = 4):
    steps = []
    for _ in range(count):
        p, m, v = (buffer(numel, torch.float32, huge) for _ in range(3))
        g = buffer(numel, torch.bfloat16, huge)
        p.normal_()
        m.zero_()
        v.zero_()
        g.copy_(torch.randn(numel) * 1e-3)

        def step(p=p, m=m, v=v, g=g) -> None:
            native.adamw_step(param=p, exp_avg=m, exp_avg_sq=v, grad=g, weights_out=g,
                              decay_end=numel, lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8,
                              weight_decay=0.0, grad_scale=1.0, step=1)
        steps.append(step)
    return steps


def with_dma(fn, nbytes: int = 2**28):
    """Run fn while both copy engines stream pinned buffers; returns (fn's result, copy GB/s).
    Raises if the copies ended before fn did: then fn did not run beside them throughout."""
    engines = CopyEngines(nbytes)
    copies = 400  # far longer than fn: the copies run throughout
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = engines.start(copies)
    result = fn()
    if all(e.query() for e in done):
        raise RuntimeError("the copies finished before the AdamW run: raise `copies`")
    torch.cuda.synchronize()
    return result, 2 * copies * nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes-mi", default="16,64,100")
    ap.add_argument("--passes", type=int, default=6)
    args = ap.parse_args()
    native = load_kernels()
    if native is None:
        raise SystemExit("the native AdamW did not build: nothing to probe")
    report = {"thp_enabled": read("/sys/kernel/mm/transparent_hugepage/enabled"),
              "thp_defrag": read("/sys/kernel/mm/transparent_hugepage/defrag"),
              "threads": torch.get_num_threads(), "rows": []}
    print(report, flush=True)
    cuda = torch.cuda.is_available()
    for size_mi in (int(s) for s in args.sizes_mi.split(",")):
        for huge in (False, True):
            before = anon_huge_bytes()
            steps = blocks(native, size_mi * MI, huge)
            got_huge = anon_huge_bytes() - before
            numel = size_mi * MI

            def run(steps=steps, numel=numel) -> float:
                return sustained_rate(lambda i: steps[i](), len(steps), len(steps) * numel,
                                      args.passes)
            alone = [run() for _ in range(3)]
            row = {"block_mi_params": size_mi, "huge_pages_asked": huge,
                   "anon_huge_gib": got_huge / 2**30,
                   "alone_gparam_s": [r / 1e9 for r in alone],
                   "alone_best_gb_s": max(alone) * 28 / 1e9}
            if cuda:
                shared = [with_dma(run) for _ in range(3)]
                row["with_dma_gparam_s"] = [r / 1e9 for r, _ in shared]
                row["with_dma_copies_gb_s"] = [c for _, c in shared]
            print(json.dumps(row), flush=True)
            report["rows"].append(row)
            del steps, run  # run's default argument holds the blocks too
    for size_mi in sorted({r["block_mi_params"] for r in report["rows"]}):
        plain, huge = (next(r for r in report["rows"] if r["block_mi_params"] == size_mi
                            and r["huge_pages_asked"] is h) for h in (False, True))
        key = "with_dma_gparam_s" if cuda else "alone_gparam_s"
        ratio = statistics.median(huge[key]) / statistics.median(plain[key])
        print(f"{size_mi} Mi params per block: huge pages / ordinary = {ratio:.3f} ({key}, "
              f"medians of 3)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
