#!/usr/bin/env bash
# Issue 26 on the H200 benchmark machine, one call: why the executor's CPU AdamW outruns
# calibrate's test of it (adamw_gap_probe), the layer-major backward beside AdamW
# (layer_dispatch_probe --into-sum --beside-adamw), then a timed thorough calibration and the
# validation rows given, with the allocator's history of those in $HISTORY. The probes' JSON
# comes back in probes.tar.gz (the validation writes 7 files; 8 come back).
# usage (device): HISTORY=LABELS bash benchmarks/probes/run_adamw_gap_gpu.sh [validate_sim.py args]
set -uo pipefail
source benchmarks/device_env.sh
probes=/tmp/probes && rm -rf $probes && mkdir -p $probes  # one tarball: 8 files come back
python3 benchmarks/probes/adamw_gap_probe.py --out $probes/adamw_gap.json 2>&1 | tail -20
python3 benchmarks/probes/layer_dispatch_probe.py --models qwen3-4b --micro-batches 4 \
    --into-sum --beside-adamw 100000000 --out $probes 2>&1 | tail -12
tar czf "$out/probes.tar.gz" -C /tmp probes
bash benchmarks/run_validation_gpu.sh --allocator-history "${HISTORY:-}" "$@"
