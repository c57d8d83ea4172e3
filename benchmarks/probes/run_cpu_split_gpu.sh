#!/usr/bin/env bash
# One device call: how the CPU AdamW is spread over the cores inside the executor
# (benchmarks/probes/cpu_split_bench.py), then a thorough `layerslide calibrate` of the same machine.
# usage (device): bash benchmarks/probes/run_cpu_split_gpu.sh [cpu_split_bench.py args]
#   (wheels in $LAYERSLIDE_WHEELS, default .whl/: simpy)
set -uo pipefail
source benchmarks/device_env.sh
{ lscpu | head -25; free -g | head -2; nvidia-smi --query-gpu=name,memory.total --format=csv; } \
    > "$out/machine.txt" 2>&1
python3 benchmarks/probes/cpu_split_bench.py --out "$out" "$@" 2>&1 | grep -v -i warn \
    | tee "$out/cpu_split.log"
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"; mkdir -p "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
python3 -c "import sys; from layerslide.cli.main import main; sys.exit(main())" calibrate \
    --out "$out/h200-calibrated.toml" --disk-dir "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme" --ram 128GiB 2>&1 \
    | tee "$out/calibrate.log"
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
