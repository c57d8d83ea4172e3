#!/usr/bin/env bash
# One GPU through what session 33 changed (issues 53, 52), in one device call: the `-m gpu`
# tests; `train` under torchrun (one rank: its NCCL group bound to its GPU); a run with half its
# moments on NVMe checkpointed beside training at steps 3 and 6, resumed from step 3 (step 6's
# checkpoint removed) to compare steps 4-6 with the run that did not stop, then exported.
# usage (device, with .whl carried): bash benchmarks/run_ranks_smoke_gpu.sh
set -uo pipefail
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
    | grep -v "Warning: " | tail -25 | tee "$out/gpu_tests.txt"
common=(--model llama-3.2-1b --seq-len 1024 --micro-batch 4 --gpu-memory 24GiB
        --profile h200-bench)
quiet() { grep -v "^step \|Warning: " | tail -"$1"; }
timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m layerslide \
    train "${common[@]}" --steps 6 --log-jsonl "$out/torchrun.jsonl" 2>&1 | quiet 12 \
    | tee "$out/torchrun.txt"
scratch=${LAYERSLIDE_NVME_DIR:-/tmp}/ls_smoke
rm -rf "$scratch" && mkdir -p "$scratch"
timeout 300 python3 -m layerslide train "${common[@]}" --steps 6 --moments-on-nvme 0.5 \
    --nvme-dir "$scratch/nvme" --checkpoint-dir "$scratch/ckpt" --checkpoint-every 3 \
    --log-jsonl "$out/straight.jsonl" 2>&1 | quiet 12 | tee "$out/straight.txt"
ls "$scratch/ckpt" | tee "$out/checkpoints.txt"
rm -rf "$scratch"/ckpt/step-000000006
timeout 300 python3 -m layerslide train --resume "$scratch/ckpt" --log-jsonl "$out/resumed.jsonl" \
    2>&1 | quiet 12 | tee "$out/resumed.txt"
timeout 200 python3 -m layerslide export "$scratch/ckpt" --out "$scratch/model" 2>&1 | tail -5 \
    | tee "$out/export.txt"
python3 - "$out" <<'PY' | tee "$out/compare.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, (out / name).read_text().splitlines())
            if "loss" in r}
straight, resumed = losses("straight.jsonl"), losses("resumed.jsonl")
same = [s for s in resumed if s in straight]
print("steps compared:", same, "bit for bit:", all(straight[s] == resumed[s] for s in same))
for s in same:
    print(s, straight[s], resumed[s])
PY
