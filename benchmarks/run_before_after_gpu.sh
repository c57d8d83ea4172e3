#!/usr/bin/env bash
# A change's effect on `layerslide train` in one device call: the `-m gpu` tests of this code,
# then Llama-3.2-3B (sequence 1024, 24 GiB cap, default policy) trained at each micro-batch by
# the code before the change and this code, in the order before, after, after, before (so that
# drift of the lent machine falls on both alike); the median step of each run after warm-up.
# usage (device, with .whl (simpy) and .baseline carried):
#   bash benchmarks/run_before_after_gpu.sh [--no-tests] MICRO_BATCH:STEPS ...
# .baseline holds the package before the change: `git archive <commit> layerslide | tar -x -C .baseline`
set -uo pipefail
source benchmarks/device_env.sh
here=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
if [ "${1:-}" = "--no-tests" ]; then shift; else
    timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | grep -v "Warning: " | tail -20 | tee "$out/gpu_tests.txt"
fi
for run in "$@"; do
    mb=${run%%:*}; steps=${run##*:}
    for version in before after after before; do
        src=$here; [ "$version" = before ] && src=$here/.baseline
        log="$out/mb${mb}_${version}.jsonl"
        [ -e "$log" ] && log="$out/mb${mb}_${version}2.jsonl"
        PYTHONPATH=/tmp/site:$src timeout 280 python3 -m layerslide.cli.main train \
            --model llama-3.2-3b --micro-batch "$mb" --seq-len 1024 --gpu-memory 24GiB \
            --steps "$steps" --log-jsonl "$log" 2>/dev/null | grep -v "^step " | tail -2
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
rows = {}
for path in sorted(Path(sys.argv[1]).glob("mb*.jsonl")):
    logs = [json.loads(line) for line in path.read_text().splitlines()]
    name = path.stem
    mb, version = name.split("_")
    steady = [log["step_s"] for log in logs[2:]]  # the first two carry compilation
    rows.setdefault(mb, {}).setdefault(version.rstrip("2"), []).append(statistics.median(steady))
    print(f"{name}: median {statistics.median(steady):.4f} s/step over {len(steady)} steps, "
          f"GPU peak {max(l['gpu_peak_bytes'] for l in logs) / 2**30:.2f} GiB, host "
          f"{max(l['host_rss_bytes'] for l in logs) / 2**30:.1f} GiB, last loss {logs[-1]['loss']:.4f}")
for mb, sides in rows.items():
    before, after = statistics.mean(sides["before"]), statistics.mean(sides["after"])
    print(f"{mb}: before {before:.4f} s, after {after:.4f} s: after/before {after / before:.4f}")
PY
