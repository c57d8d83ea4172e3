#!/usr/bin/env bash
# The four rows issue 26 measured (layerslide train, 24 GiB cap, one H200; measured step in the
# issue), predicted by `layerslide simulate` on the profile given (default h200-bench).
profile=${1:-h200-bench}
while IFS=: read -r flags measured; do
    # shellcheck disable=SC2086
    layerslide simulate --model $flags --gpu-memory 24GiB --profile "$profile" --json \
        | python3 -c "import json, sys; d = json.load(sys.stdin); print(f'$flags: predicted {d[\"step_s\"]:.3f} s, measured $measured, {d[\"step_s\"] / $measured - 1:+.1%}, {d[\"bottleneck\"]}-bound')"
done <<'ROWS'
llama-3.1-8b --micro-batch 16:1.966
mistral-7b --micro-batch 8:1.629
qwen3-4b --micro-batch 4 --window 2 --activations gpu:1.165
qwen3-4b --micro-batch 32:1.903
ROWS
