#!/usr/bin/env bash
# Compact AdamW moments (issue 23) on the device, one set per call:
# SET kernels: the native AdamW per moment precision (benchmarks/moment_kernels_bench.py, all
#         cores and 8 threads), then the `-m gpu` tests of compact moments (the torch step of
#         GPU-updated blocks on CUDA).
# SET speed: Llama-3.2-3B, default policy, 24 GiB cap, micro-batch 8 then 1, fp32 / bf16 / int8
#         moments in turn (the order fp32, bf16, int8, fp32 at micro-batch 8: drift shows).
# SET capacity: Llama-3.1-8B with all state in RAM and the lean policy (cast on the GPU, two
#         pooled grad buffers), bf16 then int8 moments: host RSS per billion parameters.
# SET quality: benchmarks/moment_quality.py's default run (a ~25M Llama trained from scratch on
#         the standard library's sources, fp32 / bf16 / int8 moments, held-out loss curves).
# usage (device, with .whl (simpy) carried): bash benchmarks/run_moments_gpu.sh SET
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket" | tee -a "$out/machine.txt"
git rev-parse HEAD 2>/dev/null | tee "$out/commit.txt"
source benchmarks/train_runs.sh

case "${1:-}" in
kernels)
    python3 benchmarks/moment_kernels_bench.py --json "$out/kernels_all.json" 2>&1 \
        | tee "$out/kernels.txt"
    python3 benchmarks/moment_kernels_bench.py --threads 8 --json "$out/kernels_8.json" 2>&1 \
        | tee -a "$out/kernels.txt"
    timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -k "bf16 or int8 or moment" \
        tests 2>&1 | grep -v "Warning: " | tail -8 | tee "$out/gpu_tests.txt"
    ;;
speed)
    m=(--model llama-3.2-3b)
    run mb8_fp32 8 120 "${m[@]}" --micro-batch 8
    run mb8_bf16 8 120 "${m[@]}" --micro-batch 8 --moment-precision bf16
    run mb8_int8 8 120 "${m[@]}" --micro-batch 8 --moment-precision int8
    run mb8_fp32_again 8 120 "${m[@]}" --micro-batch 8
    run mb1_fp32 8 100 "${m[@]}" --micro-batch 1
    run mb1_bf16 8 100 "${m[@]}" --micro-batch 1 --moment-precision bf16
    run mb1_int8 8 100 "${m[@]}" --micro-batch 1 --moment-precision int8
    ;;
capacity)
    m=(--model llama-3.1-8b --micro-batch 4 --cast gpu --host-grad-buffers 2)
    run lean8b_bf16 4 250 "${m[@]}" --moment-precision bf16
    run lean8b_int8 4 250 "${m[@]}" --moment-precision int8
    ;;
quality)
    timeout 560 python3 benchmarks/moment_quality.py --out "$out/quality" 2>&1 \
        | tail -40 | tee "$out/quality.txt"
    ;;
*)
    echo "usage: $0 kernels|speed|capacity|quality"; exit 2 ;;
esac
