#!/usr/bin/env bash
# The simulator beyond the models it was fitted on (issue 26): `layerslide train` on the 4 rows
# the issue names (24 GiB cap, default policy otherwise, random weights, synthetic tokens),
# read from train's own end-of-run check of the prediction (h200-bench). Usage:
#   fidelity_gpu.sh ROW...   (ROW: llama8b_mb16 mistral7b_mb8 qwen4b_mb4_w2 qwen4b_mb32)
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
row_flags() {
    case $1 in
        llama8b_mb16) echo "--model llama-3.1-8b --micro-batch 16" ;;
        mistral7b_mb8) echo "--model mistral-7b --micro-batch 8" ;;
        qwen4b_mb4_w2) echo "--model qwen3-4b --micro-batch 4 --window 2 --activations gpu" ;;
        qwen4b_mb32) echo "--model qwen3-4b --micro-batch 32" ;;
    esac
}
for row in "$@"; do
    # shellcheck disable=SC2046
    timeout "${ROW_TIMEOUT:-120}" python3 -m layerslide.cli.main train $(row_flags "$row") \
        --seq-len 1024 --gpu-memory 24GiB --steps 6 --log-jsonl "$out/$row.jsonl" \
        > "$out/$row.txt" 2>&1
    echo "$row (rc $?): $(grep '^prediction on' "$out/$row.txt")" | tee -a "$out/summary.txt"
done
