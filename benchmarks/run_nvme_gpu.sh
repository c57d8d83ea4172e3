#!/usr/bin/env bash
# Issue 4 on the H200 benchmark machine: moments on disk against in RAM (Llama-3.2-1B, micro-batch
# 8), next to the simulator's prediction for the disk speed measured in the same run.
# usage (device): bash benchmarks/run_nvme_gpu.sh [extra nvme_bench.py args]   (.whl: simpy)
set -uo pipefail
source benchmarks/device_env.sh
df -h /tmp | tail -1; free -g | head -2
python3 benchmarks/nvme_bench.py --nvme-dir /tmp/nvme --out "$out" "$@" 2>&1 | grep -v -i warn
