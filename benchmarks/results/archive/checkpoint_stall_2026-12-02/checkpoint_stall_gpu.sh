#!/usr/bin/env bash
# Checkpoint stall, sync against beside training, Llama-3.2-1B micro-batch 8 on one H200, and
# the byte identity of one state checkpointed both ways.
set -uo pipefail
source benchmarks/device_env.sh
here=benchmarks/results/archive/checkpoint_stall_2026-12-02
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
df -h /tmp | tee -a "$out/machine.txt"
timeout 300 python3 $here/checkpoint_stall.py --model llama-3.2-1b --micro-batch 8 \
    --steps 60 --out "$out" 2>&1 | grep -v Warning | tail -5 | tee "$out/stall.txt"
