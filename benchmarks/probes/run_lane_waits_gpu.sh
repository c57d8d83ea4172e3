#!/usr/bin/env bash
# Issue 26 on the H200 benchmark machine, one short call: Qwen3-4B layer-major (the GPU-bound row
# whose backward enqueue slows beside the CPU AdamW) with its lanes polling GPU events against
# watchers that sleep on them (Policy.executor.lane_waits), interleaved, twice each. No
# calibration: PROFILE prices the predictions; the rows compare executor variants side by side.
# usage (device): bash benchmarks/probes/run_lane_waits_gpu.sh PROFILE [DEADLINE_S]
set -uo pipefail
source benchmarks/device_env.sh
q=qwen4b-mb4x4-w2-host-lm
python3 benchmarks/validate_sim.py --profile "$1" --nvme-dir /tmp/nvme --traces /tmp/lw/traces \
    --out /tmp/lw --configs "$q,$q-watch" --repeats 2 --steps 5 --warmup-steps 1 \
    --deadline "${2:-110}" 2>&1 | grep -v -i warn | tee "$out/qwen.log"
cp /tmp/lw/validation.md /tmp/lw/validation.json "$out/" 2>/dev/null
