#!/usr/bin/env bash
# Issue 26 on the H200 benchmark machine, one call: is the GPU lane's enqueue slowed beside the
# CPU AdamW by the cores its threads take? Executor variants (validate_sim.py's -t12, -t14,
# -nice10, -nice19, -switch1ms) run beside their base row, measured side by side. Each SET is
# "NAME CONFIGS REPEATS"; the default sets are validation_2026-12-04b call2's (Qwen3-4B
# layer-major on 14 and 12 AdamW threads and a 1 ms GIL switch interval, twice each; Mistral-7B
# mb8 on 16, 14 and 12 threads, once). No calibration: PROFILE (a calibrated file) prices the
# predictions. Every set's validation comes back in results.tar.gz, its table as NAME.md.
# usage (device): bash benchmarks/probes/run_threads_gpu.sh PROFILE [SET ...]
set -uo pipefail
source benchmarks/device_env.sh
profile=$1 && shift
q=qwen4b-mb4x4-w2-host-lm
m=mistral7b-mb8-w2-host
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=("qwen $q,$q-t14,$q-t12,$q-switch1ms 2" "mistral $m,$m-t14,$m-t12 1")
res=/tmp/threads && rm -rf $res && mkdir -p $res
for set in "${sets[@]}"; do
    read -r name configs repeats <<< "$set"
    python3 benchmarks/validate_sim.py --profile "$profile" --nvme-dir /tmp/nvme \
        --traces "$res/$name/traces" --out "$res/$name" --configs "$configs" \
        --repeats "$repeats" --steps 5 --warmup-steps 1 2>&1 | grep -v -i warn \
        | tee "$res/$name.log"
    cp "$res/$name/validation.md" "$out/$name.md"
done
tar czf "$out/results.tar.gz" -C /tmp threads
