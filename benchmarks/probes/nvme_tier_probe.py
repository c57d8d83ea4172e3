"""The disk as the NVMe tier meets it, beside what `calibrate` measures, in one run.

In training the tier's reads ran alone at 1.6-2.1 GB/s where calibrate read its 4 GiB file,
just written, at 1.0-1.1 (benchmarks/probes/nvme_overlap.py). This probe measures, in order:

1. calibrate's own disk test (`calibrate.host.disk`, one 4 GiB file);
2. through the tier's own code (executor.nvme.NvmeState: a new file per write that replaces the
   old one, O_DIRECT, 64 MiB calls), `--blocks` block files of `--block-mib`:
   writes alone, then reads alone right after, then reads alone again after `--pause` seconds;
3. the tier's pipeline for `--rounds` rounds: a reader fills two staging buffers ahead while a
   writer writes each block back once it is read (the optimizer's step taken as instant), as
   the executor does when the disk is the bottleneck;
4. writes alone once more, right after the pipeline.

Every read and write is kept (start, end, bytes) in the JSON; the table gives the rates of
reads and writes alone and of each direction while the other ran throughout.

    python benchmarks/probes/nvme_tier_probe.py --dir /tmp/nvme --out R/nvme_tier.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from layerslide.calibrate.host import disk
from layerslide.executor.nvme import NvmeState

GIB, MIB = 2**30, 2**20


class Recorder:
    def __init__(self, state: NvmeState):
        self.state, self.ops, self.t0 = state, [], time.perf_counter()
        self.lock = threading.Lock()

    def timed(self, phase: str, op: str, block: int, slot: int) -> None:
        start = time.perf_counter()
        getattr(self.state, op)(block, slot)
        end = time.perf_counter()
        with self.lock:
            self.ops.append({"phase": phase, "op": op, "block": block, "start_s": start - self.t0,
                             "end_s": end - self.t0, "bytes": self.state.file_bytes[block]})


def pipeline(rec: Recorder, blocks: int, rounds: int) -> None:
    """Reads run up to two blocks ahead of the writes (two staging buffers, as
    policy.schedule.nvme_prefetch = 2); each block is written back from its buffer once read."""
    free = threading.Semaphore(2)
    read_done: list[threading.Event] = [threading.Event() for _ in range(blocks * rounds)]

    def reader() -> None:
        for i in range(blocks * rounds):
            free.acquire()
            rec.timed("pipeline", "read", i % blocks, i % 2)
            read_done[i].set()

    def writer() -> None:
        for i in range(blocks * rounds):
            read_done[i].wait()
            rec.timed("pipeline", "write", i % blocks, i % 2)
            free.release()

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def overlapped(op: dict, others: list[dict]) -> float:
    shared = sum(max(0.0, min(op["end_s"], o["end_s"]) - max(op["start_s"], o["start_s"]))
                 for o in others)
    return shared / (op["end_s"] - op["start_s"])


def summary(ops: list[dict]) -> dict:
    out = {}
    for phase in dict.fromkeys(o["phase"] for o in ops):
        mine = [o for o in ops if o["phase"] == phase]
        for op in ("read", "write"):
            these = [o for o in mine if o["op"] == op]
            if not these:
                continue
            others = [o for o in mine if o["op"] != op]
            beside = [o for o in these if others and overlapped(o, others) >= 0.95]
            alone = [o for o in these if not others or overlapped(o, others) <= 0.05]
            for name, group in (("alone", alone), ("beside", beside)):
                if group:
                    rates = [o["bytes"] / (o["end_s"] - o["start_s"]) / 1e9 for o in group]
                    out[f"{phase} {op} {name}"] = {"n": len(group),
                                                   "median_gb_s": statistics.median(rates)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--block-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=5.0)
    ap.add_argument("--calibrate-gib", type=float, default=4.0)
    args = ap.parse_args()
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    report["calibrate"] = {m.key: m.value for m in disk(args.dir, int(args.calibrate_gib * GIB))}
    print(json.dumps(report["calibrate"]), flush=True)
    numel = args.block_mib * MIB // 4
    state = NvmeState(args.dir, {b: numel for b in range(args.blocks)}, {}, 2)
    rec = Recorder(state)
    try:
        for b in range(args.blocks):
            rec.timed("writes alone", "write", b, 0)
        for b in range(args.blocks):
            rec.timed("reads right after", "read", b, 0)
        time.sleep(args.pause)
        for b in range(args.blocks):
            rec.timed("reads after a pause", "read", b, 0)
        pipeline(rec, args.blocks, args.rounds)
        for b in range(args.blocks):
            rec.timed("writes after the pipeline", "write", b, 0)
    finally:
        state.remove_files()
    report["ops"] = rec.ops
    report["summary"] = summary(rec.ops)
    pipe = [o for o in rec.ops if o["phase"] == "pipeline"]
    span = max(o["end_s"] for o in pipe) - min(o["start_s"] for o in pipe)
    moved = sum(o["bytes"] for o in pipe)
    report["pipeline_gb_s_both_ways"] = moved / span / 1e9
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print("| phase, direction | n | median GB/s |")
    print("| --- | --- | --- |")
    for key, got in report["summary"].items():
        print(f"| {key} | {got['n']} | {got['median_gb_s']:.2f} |")
    print(f"pipeline: {report['pipeline_gb_s_both_ways']:.2f} GB/s read + written; calibrate: "
          + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in report["calibrate"].items()
                      if k != "storage.capacity"))


if __name__ == "__main__":
    main()
