#!/usr/bin/env bash
# The GPU path before and after the run got its own home (issue 48), in one device call:
# optionally the `-m gpu` tests of this code and a `calibrate` profile of the machine, then
# `layerslide train` rows (Llama-3.2-3B shape, sequence 1024, 24 GiB cap, random init,
# synthetic data) by the code before (.baseline) and this code, in the order before, after,
# after, before where a row runs twice a side; each run's median step after the first two
# (which carry compilation) and train's own prediction check.
# usage (device, with .whl (simpy) and .baseline carried):
#   bash benchmarks/run_redesign_gpu.sh [--tests] [--calibrate] ROW...
# ROW: default8 (the default policy, micro-batch 8), tuned8 (tune's pick at micro-batch 8, each
# side tuning with its own code), lm16 (layer-major 4 x 16), mb64 (one micro-batch of 64).
# .baseline holds the package before: `git archive <commit> layerslide | tar -x -C .baseline`
set -uo pipefail
source benchmarks/device_env.sh
here=$(pwd)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
if [ "${1:-}" = "--tests" ]; then
    shift
    timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | grep -v "Warning: " | tail -25 | tee "$out/gpu_tests.txt"
fi
profile=h200-bench
if [ "${1:-}" = "--calibrate" ]; then
    shift
    timeout 200 python3 -m layerslide.cli.main calibrate --out "$out/calibrated.toml" 2>&1 \
        | tail -3 | tee -a "$out/log.txt" && profile=$out/calibrated.toml
fi

train() {  # version label steps flags...: one run, its summary line in log.txt
    local version=$1 label=$2 steps=$3
    shift 3
    local src=$here log="$out/${label}_${version}.jsonl"
    [ "$version" = before ] && src=$here/.baseline
    [ -e "$log" ] && log="$out/${label}_${version}2.jsonl"
    echo "== $label $version: train $*" | tee -a "$out/log.txt"
    PYTHONPATH=/tmp/site:$src timeout 240 python3 -m layerslide.cli.main train \
        --seq-len 1024 --gpu-memory 24GiB --steps "$steps" --profile "$profile" \
        --log-jsonl "$log" "$@" 2>&1 | grep -v "^step \|Warning: " | grep "prediction on\|error" \
        | tee -a "$out/log.txt"
}

tuned() {  # version: tune's pick for micro-batch 8 by that version's code
    local src=$here
    [ "$1" = before ] && src=$here/.baseline
    PYTHONPATH=/tmp/site:$src timeout 200 python3 -m layerslide.cli.main tune \
        --model llama-3.2-3b --gpu-memory 24GiB --seq-len 1024 --micro-batches 8 \
        --profile "$profile" -o "$out/tuned8_$1.json" > /dev/null 2>&1
    echo "$out/tuned8_$1.json"
}

for row in "$@"; do
    for version in before after after before; do
        case $row in
        default8) train $version default8 8 --model llama-3.2-3b --micro-batch 8 ;;
        tuned8) plan=$( [ -e "$out/tuned8_$version.json" ] && echo "$out/tuned8_$version.json" \
                        || tuned $version )
                train $version tuned8 8 --model llama-3.2-3b --plan "$plan" ;;
        lm16) train $version lm16 5 --model llama-3.2-3b --micro-batch 4 --grad-accum 16 \
                  --accumulation layer_major ;;
        mb64) train $version mb64 5 --model llama-3.2-3b --micro-batch 64 ;;
        esac
        [ "$row" = lm16 ] || [ "$row" = mb64 ] && [ "$version" = after ] && break
    done
done
python3 benchmarks/redesign_summary.py "$out" | tee "$out/summary.txt"
