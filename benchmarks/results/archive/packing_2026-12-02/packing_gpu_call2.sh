#!/usr/bin/env bash
# The document mask's cost where the step is GPU-bound: Llama-3.2-3B shape, micro-batch 32.
set -uo pipefail
source benchmarks/device_env.sh
here=benchmarks/results/archive/packing_2026-12-02
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
chat=${CHAT_DATA:-/tmp/chat}
[ -f "$chat/chat.jsonl" ] || python3 benchmarks/results/archive/masking_2026-12-02/make_chat_data.py --out "$chat"
data=(--model llama-3.2-3b --tokenizer "$chat/tokenizer" --data "$chat/chat.jsonl")
for label in mb32_mask mb32_cross; do
    extra=(); [ $label = mb32_cross ] && extra=(--attend-across-documents)
    timeout 150 python3 -m layerslide.cli.main train --gpu-memory 24GiB --steps 8 \
        --micro-batch 32 --seq-len 1024 --packing on "${extra[@]}" "${data[@]}" \
        --log-jsonl "$out/$label.jsonl" > "$out/$label.txt" 2>&1
    tail -2 "$out/$label.txt"
done
python3 $here/packing_summary.py "$out" | tee "$out/packing_summary.txt"
