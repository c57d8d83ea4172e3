#!/usr/bin/env bash
# Packing with document masks against plain causal packing and padded rows: Llama-3.2-3B shape
# (random weights), chat records from the stdlib's docstrings, 24 GiB cap, default policy.
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" | tee -a "$out/machine.txt"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/executor/test_evaluation.py \
    tests/executor/test_trainer.py -k "packed or eval" 2>&1 | grep -v "Warning: " | tail -6 \
    | tee "$out/gpu_tests.txt"
here=benchmarks/results/archive/packing_2026-12-02
chat=${CHAT_DATA:-/tmp/chat}  # made by the masking benchmark's script where missing
[ -f "$chat/chat.jsonl" ] || python3 benchmarks/results/archive/masking_2026-12-02/make_chat_data.py --out "$chat"
data=(--model llama-3.2-3b --tokenizer "$chat/tokenizer" --data "$chat/chat.jsonl")
train() {  # label flags...
    local label=$1
    shift
    echo "== $label: $*" | tee -a "$out/log.txt"
    timeout 240 python3 -m layerslide.cli.main train --gpu-memory 24GiB --steps 10 \
        --micro-batch 8 --seq-len 1024 --log-jsonl "$out/$label.jsonl" "${data[@]}" "$@" \
        > "$out/$label.txt" 2>&1
    grep -E "^data:|^eval|Error|error" "$out/$label.txt" | tee -a "$out/log.txt"
}
train packed_mask --packing on --eval-fraction 0.02 --eval-every 5 --eval-rows 64
train packed_cross --packing on --attend-across-documents --eval-fraction 0.02
train padded_1024 --packing off --eval-fraction 0.02
train padded_256 --packing off --seq-len 256 --micro-batch 32 --eval-fraction 0.02
python3 $here/packing_summary.py "$out" | tee "$out/summary.txt"
