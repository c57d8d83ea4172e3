#!/usr/bin/env bash
# Session 9's probes on the H200 benchmark machine, one call: how AdamW and each copy direction
# share host memory (host_sharing_probe.py), then the disk as the NVMe tier meets it beside
# calibrate's test (nvme_tier_probe.py). usage (device): bash benchmarks/probes/run_sharing_probes_gpu.sh
set -uo pipefail
source benchmarks/device_env.sh
nproc > "$out/machine.txt"; free -g >> "$out/machine.txt"; df -h /tmp >> "$out/machine.txt"
python3 benchmarks/probes/host_sharing_probe.py --out "$out/host_sharing.json" 2>&1 \
    | tee "$out/host_sharing.log"
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
python3 benchmarks/probes/nvme_tier_probe.py --dir "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme" --out "$out/nvme_tier.json" 2>&1 \
    | tee "$out/nvme_tier.log"
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
