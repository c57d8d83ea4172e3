#!/usr/bin/env bash
# Compact AdamW moments (issue 23) on the device, one set per call:
# SET kernels: the native AdamW per moment precision (benchmarks/moment_kernels_bench.py, then
#         as calibrate measures it), then the `-m gpu` tests of compact moments.
# SET speed: SET kernels' measurements, then Llama-3.2-3B, default policy, 24 GiB cap,
#         micro-batch 8 then 1, fp32 / bf16 / int8 moments in turn.
# SET capacity: Llama-3.1-8B with all state in RAM and the lean policy (cast on the GPU, two
#         pooled grad buffers), bf16 then int8 moments: host RSS per billion parameters.
# SET quality [PRECISIONS]: benchmarks/moment_quality.py's default run (a ~30M Llama trained
#         from scratch on the standard library's sources; fp32,bf16,int8 moments unless
#         PRECISIONS names some; merge calls' results with its --plot-only).
# usage (device, with .whl (simpy) carried): bash benchmarks/run_moments_gpu.sh SET
# (the device's copy has no git history: the commit is recorded where the results land)
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket" | tee -a "$out/machine.txt"
source benchmarks/train_runs.sh

kernels() {  # the kernels side by side, then each as calibrate measures it (the profile's rate)
    python3 benchmarks/moment_kernels_bench.py --json "$out/kernels_all.json" 2>&1 \
        | tee "$out/kernels.txt"
    python3 - <<'PY' 2>&1 | tee "$out/sustained.txt"
from layerslide.calibrate import host
numel, repeats = 4 * 100 * 2**20, 10  # calibrate's thorough AdamW blocks
for m in [host.adamw_throughput(numel, repeats), *host.compact_adamw_throughput(numel, repeats)]:
    print(f"{m.key}: {m.value / 1e9:.3f} Gparam/s ({m.how})")
PY
}

case "${1:-}" in
kernels)
    kernels
    timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -k "bf16 or int8 or moment" \
        tests 2>&1 | grep -v "Warning: " | tail -8 | tee "$out/gpu_tests.txt"
    ;;
speed)
    kernels
    m=(--model llama-3.2-3b)
    run mb8_fp32 6 150 "${m[@]}" --micro-batch 8
    run mb8_bf16 6 150 "${m[@]}" --micro-batch 8 --moment-precision bf16
    run mb8_int8 6 150 "${m[@]}" --micro-batch 8 --moment-precision int8
    run mb1_fp32 6 120 "${m[@]}" --micro-batch 1
    run mb1_bf16 6 120 "${m[@]}" --micro-batch 1 --moment-precision bf16
    run mb1_int8 6 120 "${m[@]}" --micro-batch 1 --moment-precision int8
    ;;
capacity)
    m=(--model llama-3.1-8b --micro-batch 4 --cast gpu --host-grad-buffers 2)
    run lean8b_bf16 4 250 "${m[@]}" --moment-precision bf16
    run lean8b_int8 4 250 "${m[@]}" --moment-precision int8
    ;;
quality)
    timeout 570 python3 benchmarks/moment_quality.py --out "$out/quality" \
        --precisions "${2:-fp32,bf16,int8}" 2>&1 | tail -40 | tee "$out/quality.txt"
    ;;
*)
    echo "usage: $0 kernels|speed|capacity|quality"; exit 2 ;;
esac
