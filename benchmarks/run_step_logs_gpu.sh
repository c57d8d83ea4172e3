#!/usr/bin/env bash
# Issue 52: step lines and records per step on a GPU, in one device call. The `-m gpu` tests;
# then the same 1B run (48 steps, segments of 16, stdout to a pipe as under a batch scheduler)
# with main before the change (a copy in $1, default .base52) and this code, alternated twice:
# each stdout line is stamped with the time it arrived, and the JSONL keeps each step's time.
# usage (device, with .whl and the copy carried): bash benchmarks/run_step_logs_gpu.sh [.base52]
# [--no-tests]
set -uo pipefail
base=${1:-.base52}
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
if [ "${2:-}" != --no-tests ]; then
    timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | grep -v "Warning: " | tail -15 | tee "$out/gpu_tests.txt"
fi
stamp() {  # each line as it arrives, with the seconds since the first
    python3 -c 'import sys,time
t0 = None
for line in sys.stdin:
    now = time.monotonic(); t0 = t0 or now
    print(f"{now - t0:9.3f} {line}", end="", flush=True)'
}
for round in 1 2; do
    for code in base new; do
        root=$(pwd); [ "$code" = base ] && root=$(pwd)/$base
        # from its own folder: `python -m` puts the working directory first on the path
        (cd "$root" && PYTHONPATH=/tmp/site:$root timeout 240 python3 -m layerslide train \
            --model llama-3.2-1b --seq-len 1024 --micro-batch 4 --gpu-memory 24GiB \
            --profile h200-bench --steps 48 --segment-steps 16 \
            --log-jsonl "$out/$code-$round.jsonl" 2>/dev/null) | stamp > "$out/$code-$round.txt"
    done
done
python3 benchmarks/step_log_arrivals.py "$out" | tee "$out/summary.md"
rm -f "$out"/*-2.txt  # the files that come back are few: the summary has them
