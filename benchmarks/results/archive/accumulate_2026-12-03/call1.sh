#!/usr/bin/env bash
# One device call (session 20): the checkpoint stall three ways (checkpoint_stall_2026-12-03),
# the accumulation kernel against torch's add_ on this host, and the row it missed
# (qwen4b-mb4x4-w2-host, step-major accumulation) twice, on validation_2026-12-03a's profile
# (calibrated on the lease before this one: no time for a calibration of its own).
set -uo pipefail
source benchmarks/device_env.sh
here=benchmarks/results/archive/accumulate_2026-12-03
OUT=$out bash benchmarks/results/archive/checkpoint_stall_2026-12-03/checkpoint_stall_gpu.sh
python3 $here/accumulate_bench.py --out "$out/accumulate_h200.json" 2>&1 | grep -v Warn
rm -rf /tmp/nvme-v; mkdir -p "$out/validation"
timeout 200 python3 benchmarks/validate_sim.py --profile $here/h200-calibrated-validation_2026-12-03a.toml \
    --configs qwen4b-mb4x4-w2-host --repeats 2 --steps 5 --warmup-steps 1 --nvme-dir /tmp/nvme-v \
    --out "$out/validation" 2>&1 | grep -v -i warn | tee "$out/validation/validate.log" | tail -15
rm -f "$out/validation/validation.png"
