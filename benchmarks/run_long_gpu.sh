#!/usr/bin/env bash
# Issues 7 and 8 on the H200 benchmark machine, one call: the executor's GPU tests (reference
# match, serial == overlapped, resume, with compiled layers and the Triton head), then a
# 200-step run of Llama-3.2-1B under a 24 GiB cap with a checkpoint every 100 steps, whose
# per-step GPU and host memory show whether anything grows after warm-up.
# usage (device): bash benchmarks/run_long_gpu.sh   (with .whl carried: simpy)
set -uo pipefail
source benchmarks/device_env.sh
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/executor 2>&1 \
    | grep -v -i warn | tail -15 | tee "$out/gpu_tests.txt"
python3 -m layerslide.cli.main train --model llama-3.2-1b --steps 200 --micro-batch 1 \
    --seq-len 1024 --gpu-memory 24GiB --checkpoint-dir /tmp/ckpt --checkpoint-every 100 \
    --keep-checkpoints 1 --log-jsonl "$out/run200.jsonl" 2>/dev/null \
    | grep -v "^step [0-9]*/200 " ; df -h /tmp | tail -1
python3 - "$out/run200.jsonl" <<'PY'
import json, sys
logs = [json.loads(line) for line in open(sys.argv[1])]
def gib(b): return b / 2**30
for lo, hi in ((1, 20), (20, 100), (100, 200)):
    part = logs[lo:hi]
    print(f"steps {lo + 1}-{hi}: GPU peak {gib(max(l['gpu_peak_bytes'] for l in part)):.3f} GiB, "
          f"host RSS {gib(min(l['host_rss_bytes'] for l in part)):.2f}-"
          f"{gib(max(l['host_rss_bytes'] for l in part)):.2f} GiB, median step "
          f"{sorted(l['step_s'] for l in part)[len(part) // 2]:.3f} s, loss {part[-1]['loss']:.3f}")
PY
