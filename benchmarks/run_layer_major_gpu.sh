#!/usr/bin/env bash
# Layer-major accumulation against its yardsticks in one device call: optionally the `-m gpu`
# tests, then `layerslide train` runs of one set (sequence 1024, 24 GiB cap, random init,
# synthetic data), each run's median step after the first two (which carry compilation).
# usage (device, with .whl (simpy) carried):
#   bash benchmarks/run_layer_major_gpu.sh [--tests] SET
# SET 3b: Llama-3.2-3B, layer-major micro-batch 4 x 16 against one micro-batch of 64, in the
#         order LM, 64, 64, LM (drift of the lent machine falls on both alike), and step-major
#         4 x 16 once.
# SET 3b-pair: SET 3b without the step-major run (which logs no step in its time).
# SET stripes: Llama-3.2-3B layer-major 4 x 16 with 60% of its moments and half its bf16
#         weights on the disk, in one folder and striped over two folders of that disk.
# SET 8b: Llama-3.1-8B with 60% of its moments (40% of its optimizer state) on the disk:
#         accumulation 1 against layer-major 4 x 16; then 3B layer-major 4 x 16 once more.
# SET disk: Llama-3.2-3B with 60% of its moments on the disk, accumulation 1 against
#         layer-major 4 x 16.
# SET weights: Llama-3.2-3B layer-major 4 x 16 with half of its bf16 weights on the disk (read
#         at every load, written at every update) against all in RAM: the losses must agree.
# SET repeat: the in-RAM run of SET weights twice, each in a process of its own (are two
#         processes bit-identical?), after the weights_on_nvme GPU tests.
# Each run's summary line is written as it ends (a call cut short keeps what ran).
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
if [ "${1:-}" = "--tests" ]; then
    shift
    timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
        | grep -v "Warning: " | tail -20 | tee "$out/gpu_tests.txt"
fi
source benchmarks/train_runs.sh
nvme="${LAYERSLIDE_NVME_DIR:-/tmp}/layerslide-nvme"
mkdir -p "$nvme"

pair_3b() {  # layer-major 4 x 16 against micro-batch 64, in the order LM, 64, 64, LM
    local m=(--model llama-3.2-3b)
    local lm=(--micro-batch 4 --grad-accum 16 --accumulation layer_major)
    run lm16_a 8 150 "${m[@]}" "${lm[@]}"
    run mb64_a 8 150 "${m[@]}" --micro-batch 64
    run mb64_b 8 150 "${m[@]}" --micro-batch 64
    run lm16_b 8 150 "${m[@]}" "${lm[@]}"
}

case "${1:-}" in
3b)
    pair_3b
    run sm16 3 120 --model llama-3.2-3b --micro-batch 4 --grad-accum 16
    ;;
3b-pair)
    pair_3b
    ;;
8b)
    m=(--model llama-3.1-8b --moments-on-nvme 0.6 --nvme-dir "$nvme")
    run a1 4 250 "${m[@]}" --micro-batch 4
    run lm16 4 250 "${m[@]}" --micro-batch 4 --grad-accum 16 --accumulation layer_major
    run lm16_groups 6 90 --model llama-3.2-3b --micro-batch 4 --grad-accum 16 \
        --accumulation layer_major
    ;;
disk)
    # Llama-3.2-3B with 60% of its moments (40% of its optimizer state) on the disk: a step
    # of 8B's did not finish in a call's time on this machine's disk (call2)
    m=(--model llama-3.2-3b --moments-on-nvme 0.6 --nvme-dir "$nvme")
    run disk_a1 5 170 "${m[@]}" --micro-batch 4
    rm -rf "$nvme"; mkdir -p "$nvme"  # a run cut short leaves its state files behind
    run disk_lm16 5 170 "${m[@]}" --micro-batch 4 --grad-accum 16 --accumulation layer_major
    ;;
weights)
    m=(--model llama-3.2-3b --micro-batch 4 --grad-accum 16 --accumulation layer_major)
    run ram_lm16 6 150 "${m[@]}"
    run weights_lm16 6 200 "${m[@]}" --weights-on-nvme 0.5 --nvme-dir "$nvme"
    rm -rf "$nvme"
    ;;
repeat)
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -k weights_on_nvme \
        tests/executor/test_nvme.py 2>&1 | grep -v "Warning: " | tail -5 | tee "$out/gpu_tests.txt"
    m=(--model llama-3.2-3b --micro-batch 4 --grad-accum 16 --accumulation layer_major)
    run ram_a 4 120 "${m[@]}"
    run ram_b 4 120 "${m[@]}"
    ;;
stripes)
    # the state and half the bf16 weights on the disk, in one folder and then striped over two
    # folders of the same disk: the code path of several drives (the machine has one), whose
    # losses must agree and whose steps should not differ much
    m=(--model llama-3.2-3b --micro-batch 4 --grad-accum 16 --accumulation layer_major
       --moments-on-nvme 0.6 --weights-on-nvme 0.5)
    run one_folder 4 170 "${m[@]}" --nvme-dir "$nvme"
    rm -rf "$nvme"; mkdir -p "$nvme/a" "$nvme/b"
    run two_folders 4 170 "${m[@]}" --nvme-dir "$nvme/a,$nvme/b"
    ls -la "$nvme/a" | head -5 | tee -a "$out/log.txt"
    rm -rf "$nvme"
    ;;
*)
    echo "usage: $0 [--tests] 3b|3b-pair|8b|disk|weights|repeat|stripes"; exit 2 ;;
esac

