"""Activation checkpoints on disk, written through the page cache into a truncated file (as
executor.nvme's ActivationFiles did until session 28) or over the file's old bytes, against
O_DIRECT (as calibrate measures the disk and the NVMe state tier uses it), side by side on one
folder. Runs anywhere with a disk; no GPU.

Each round writes LAYERS checkpoints of BYTES (a forward's offloads), then reads them back in
reverse (the backward's reads), in each mode in turn. A training host's RAM is mostly pinned
state, which leaves the kernel little memory it may fill with dirty pages before it throttles
buffered writes to the disk's pace: --hold-gib keeps that much anonymous memory touched to
model it. Prints GB/s per mode and direction and the ratios, medians over the rounds.

    python benchmarks/probes/activation_io.py --dir /path/on/the/disk --hold-gib 16
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layerslide.executor.nvme import aligned_buffer, supports_direct
from layerslide.executor.stripes import padded

MODES = {"buffered": os.O_TRUNC, "in_place": 0, "direct": os.O_TRUNC | os.O_DIRECT}


def one_round(folder: Path, layers: int, nbytes: int, mode: str) -> tuple[float, float]:
    """(write GB/s, read GB/s) of one forward's writes and one backward's reads: through the
    page cache into a truncated file (`buffered`, the executor's way until session 28) or over
    the old bytes (`in_place`), or by O_DIRECT (`direct`)."""
    buffer = aligned_buffer(nbytes)
    direct = mode == "direct"
    view = memoryview(buffer.numpy())[:padded(nbytes) if direct else nbytes]
    flags = MODES[mode]
    began = time.perf_counter()
    for layer in range(layers):
        fd = os.open(folder / f"act_{layer}.bin", os.O_WRONLY | os.O_CREAT | flags, 0o644)
        try:
            done = 0
            while done < len(view):
                done += os.pwritev(fd, [view[done:]], done)
        finally:
            os.close(fd)
    wrote = time.perf_counter() - began
    began = time.perf_counter()
    for layer in reversed(range(layers)):
        fd = os.open(folder / f"act_{layer}.bin", os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], done)
                if got <= 0:
                    raise OSError(f"act_{layer}.bin ended after {done} bytes")
                done += got
        finally:
            os.close(fd)
    read = time.perf_counter() - began
    total = layers * nbytes / 1e9
    return total / wrote, total / read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="a folder on the disk to test")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--bytes", type=int, default=8 * 1024 * 2560 * 2,
                    help="one checkpoint (default: Qwen3-4B at micro-batch 8, 42 MB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hold-gib", type=float, default=0.0,
                    help="anonymous memory kept touched meanwhile (a training host's state)")
    ap.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = ap.parse_args()
    folder = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    if not supports_direct(folder):
        raise SystemExit(f"{folder}: the filesystem does not take O_DIRECT; name a folder on "
                         "the disk itself (tmpfs and some overlays do not)")
    held = None
    if args.hold_gib > 0:
        held = mmap.mmap(-1, int(args.hold_gib * 2**30),
                         flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for offset in range(0, len(held), mmap.PAGESIZE):
            held[offset] = 1
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    try:
        for _ in range(args.rounds):
            for mode, rounds in results.items():
                os.sync()
                rounds.append(one_round(folder, args.layers, args.bytes, mode))
    finally:
        for layer in range(args.layers):
            (folder / f"act_{layer}.bin").unlink(missing_ok=True)
    summary = {mode: {"write_GBps": statistics.median(w for w, _ in rounds),
                      "read_GBps": statistics.median(r for _, r in rounds)}
               for mode, rounds in results.items()}
    for mode, rates in summary.items():
        print(f"{mode:9s}: write {rates['write_GBps']:6.2f} GB/s, read {rates['read_GBps']:6.2f}"
              " GB/s")
    b, d = summary["buffered"], summary["direct"]
    round_s = {mode: 1 / rates["write_GBps"] + 1 / rates["read_GBps"]
               for mode, rates in summary.items()}
    print(f"direct / buffered: write {d['write_GBps'] / b['write_GBps']:.2f}x, read "
          f"{d['read_GBps'] / b['read_GBps']:.2f}x, a write and its read "
          f"{round_s['buffered'] / round_s['direct']:.2f}x as fast")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "rounds": results, "median": summary}, indent=1))
    del held


if __name__ == "__main__":
    main()
