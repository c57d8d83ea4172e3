#!/usr/bin/env bash
# Where layer-major 4 x 16 loses to one micro-batch of 64 (Llama-3.2-3B, sequence 1024, 24 GiB
# cap), in one device call: one decoder layer's kernels at micro-batches 4, 8 and 64 (eager by
# kernel family, and compiled), the fp32 grad sum two ways (grad_sum_probe.py), then both
# `train` runs with their executor traces (gzipped) for benchmarks/probes/trace_gpu_kinds.py.
# usage (device, with .whl (simpy) carried): bash benchmarks/probes/run_lm_gap_gpu.sh
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
timeout 120 python3 benchmarks/probes/grad_sum_probe.py --tokens 4096 65536 --out "$out" 2>&1 \
    | grep -v "Warning: " | tee "$out/grad_sum.txt"
for variant in eager compile; do
    timeout 150 python3 benchmarks/layer_kernels_bench.py --variant $variant \
        --micro-batches 4 8 64 --out "$out" 2>&1 | grep -v "Warning: " \
        | tee "$out/kernels_$variant.txt" | grep -v "^  "
done
run() {  # label flags...
    local label=$1
    shift
    echo "== $label: train $*" | tee -a "$out/log.txt"
    timeout 150 python3 -m layerslide.cli.main train --model llama-3.2-3b --seq-len 1024 \
        --gpu-memory 24GiB --steps 7 --log-jsonl "$out/$label.jsonl" \
        --trace-out "/tmp/$label.trace.json" "$@" 2>&1 \
        | grep -v "^step \|Warning: " | tail -3 | tee -a "$out/log.txt"
    gzip -c "/tmp/$label.trace.json" > "$out/$label.trace.json.gz"
}
run lm16 --micro-batch 4 --grad-accum 16 --accumulation layer_major
run mb64 --micro-batch 64
