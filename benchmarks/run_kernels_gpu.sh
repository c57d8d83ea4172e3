#!/usr/bin/env bash
# Issue 7 on the H200 benchmark machine, one call: the Triton head's GPU tests at real shapes,
# the head side by side (PyTorch materialised, liger-kernel, PyTorch chunked, ours), and the
# executor's step with compiled against eager layers at micro-batch 64 (compute-bound) and 8.
# usage (device): bash benchmarks/run_kernels_gpu.sh   (with .whl carried: simpy, liger-kernel)
set -uo pipefail
source benchmarks/device_env.sh
mkdir -p "$out/head" "$out/exec"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels 2>&1 | tail -5
python3 benchmarks/head_bench.py --out "$out/head" 2>&1 | grep -v -i warn | tail -40
python3 benchmarks/executor_bench.py --batches 64,8 --layer-kernels compiled,eager --steps 5 \
    --trace-batch 0 --out "$out/exec" 2>&1 | grep -v -i warn | tail -20
