#!/usr/bin/env bash
# Issue 26 on the H200 benchmark machine, one call: where the GPU thread's enqueue falls behind.
# sync_probe.py on Qwen3-4B and Llama-3.2-3B (plain and into fp32 sums, as layer-major runs
# them), then a timed thorough calibration and the validation rows given; their traces now
# carry each stream task's enqueue, and validation.md sets it measured beside predicted. The
# probe's JSON comes back in probes.tar.gz (the validation writes 7 files; 8 come back).
# usage (device): bash benchmarks/probes/run_dispatch_gpu.sh [validate_sim.py args, e.g.
#   --configs qwen4b-mb4x4-w2-host-lm,mistral7b-mb8-w2-host --repeats 2 --deadline 300]
set -uo pipefail
source benchmarks/device_env.sh
probes=/tmp/probes && rm -rf $probes && mkdir -p $probes  # one tarball: 8 files come back
for sums in "" "--into-sum"; do
    python3 benchmarks/probes/sync_probe.py --models qwen3-4b llama-3.2-3b $sums \
        --out "$probes/sync${sums:+_into_sum}.json" 2>&1 | tail -6
done
tar czf "$out/probes.tar.gz" -C /tmp probes
bash benchmarks/run_validation_gpu.sh "$@"
