"""The decoder layers' GPU-task enqueue (dispatch_start_s..dispatch_end_s) in each measured trace
of this folder's calls, split by whether a CPU optimizer step ran over most of it (> 50%) or
none of it (< 5%), warm-up step left out. Run from the repository root:

    python benchmarks/results/archive/validation_2026-12-04b/enqueue_beside_adamw.py
"""

import gzip
import json
import statistics
import tarfile
from pathlib import Path

HERE = Path(__file__).parent


def overlap(tasks, lo, hi):
    return sum(max(0.0, min(hi, t["end_s"]) - max(lo, t["start_s"])) for t in tasks)


def split(trace, kind):
    events = trace["events"]
    first = min(e["step"] for e in events)
    steps = {e["step"] for e in events} - {first}
    adamw = [e for e in events if e["lane"] == "cpu" and e["kind"] == "optimizer_step"]
    beside, without = [], []
    for e in events:
        if (e["lane"], e["kind"]) != ("gpu", kind) or e["block"] < 0 or e["step"] not in steps:
            continue
        lo, hi = e["dispatch_start_s"], e["dispatch_end_s"]
        share = overlap(adamw, lo, hi) / (hi - lo)
        (beside if share > 0.5 else without if share < 0.05 else []).append((hi - lo) * 1e3)
    return beside, without


def cell(values):
    return f"{statistics.median(values):.2f} ({len(values)})" if values else "-"


print("| call | configuration | backward beside AdamW | backward without | forward beside "
      "| forward without |")
print("| --- | --- | --- | --- | --- | --- |")
for call in ("call1", "call2", "call3"):
    for archive in sorted((HERE / call).glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                if not member.name.endswith(".measured.json.gz"):
                    continue
                trace = json.loads(gzip.decompress(tar.extractfile(member).read()))
                label = Path(member.name).name.removesuffix(".measured.json.gz")
                cells = [cell(v) for kind in ("backward", "forward") for v in split(trace, kind)]
                print(f"| {call} | {label} | " + " | ".join(cells) + " |")
