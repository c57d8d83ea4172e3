#!/usr/bin/env bash
# Checkpoint stall on one H200, Llama-3.2-1B micro-batch 8: synchronous, beside training into
# fresh copy buffers, beside training into buffers kept ahead; then one state checkpointed both
# ways compared byte for byte. Usage (repo root, GPU machine): bash THIS_FILE
set -uo pipefail
source benchmarks/device_env.sh
here=benchmarks/results/archive/checkpoint_stall_2026-12-03
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
df -h /tmp | tee -a "$out/machine.txt"
timeout 290 python3 $here/checkpoint_stall.py --model llama-3.2-1b --micro-batch 8 \
    --steps 40 --out "$out" 2>&1 | grep --line-buffered -v Warning | tee "$out/stall.txt"
