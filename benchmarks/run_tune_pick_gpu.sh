#!/usr/bin/env bash
# The largest model the benchmark machine holds, trained with what `tune` picks, in one device
# call: tune on h200-bench at a 24 GiB cap writes its best plan, `train --plan` runs it (random
# init, synthetic data, sequence 1024) with the NVMe tier on the machine's disk, and a sampler
# records the run's own drive bytes (/proc/<pid>/io) and the steps logged so far every 2 s: the
# bytes between two step ends are a step's.
# usage (device, with .whl (simpy) carried):
#   bash benchmarks/run_tune_pick_gpu.sh MODEL STEPS TIMEOUT_S [tune flags...]
set -uo pipefail
source benchmarks/device_env.sh
model=$1 steps=$2 limit=$3
shift 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
nvme="${LAYERSLIDE_NVME_DIR:-/tmp}/layerslide-nvme"
rm -rf "$nvme"; mkdir -p "$nvme"
df -h "$nvme" | tee -a "$out/machine.txt"
grep -E "MemTotal|MemAvailable" /proc/meminfo | tee -a "$out/machine.txt"
python3 -m layerslide.cli.main tune --model "$model" --profile h200-bench --gpu-memory 24GiB \
    --top 5 -o "$out/plan.json" "$@" 2>&1 | grep -v "Warning: " | tee "$out/tune.txt"
python3 -m layerslide.cli.main simulate --plan "$out/plan.json" --profile h200-bench \
    --gpu-memory 24GiB 2>&1 | tee "$out/simulate.txt"
timeout "$limit" python3 -m layerslide.cli.main train --model "$model" --plan "$out/plan.json" \
    --gpu-memory 24GiB --steps "$steps" --nvme-dir "$nvme" --log-jsonl "$out/train.jsonl" \
    > "$out/train.txt" 2>&1 &
pid=$!
sleep 1
train_pid=$(pgrep -P "$pid" | head -1)  # timeout's child: a child's I/O reaches its parent's
# counters only once it exits
while kill -0 "$train_pid" 2>/dev/null; do  # the train process's storage bytes, with a timestamp
    python3 - "$train_pid" "$out/train.jsonl" >> "$out/io.txt" 2>/dev/null <<'PY'
import os, sys, time
fields = dict(line.split(": ") for line in open(f"/proc/{sys.argv[1]}/io").read().splitlines())
steps = open(sys.argv[2]).read().count("\n") if os.path.exists(sys.argv[2]) else 0
print(f"{time.time():.1f} steps={steps} read={fields['read_bytes']} "
      f"written={fields['write_bytes']}")
PY
    sleep 2
done
wait "$pid"; echo "train exit $?" | tee -a "$out/train.txt"
dmesg 2>/dev/null | grep -iE "out of memory|oom-kill|killed process" | tail -3 | tee -a "$out/train.txt"
grep -v "Warning: " "$out/train.txt" | tail -8
rm -rf "$nvme"  # a run cut short leaves its state files behind
