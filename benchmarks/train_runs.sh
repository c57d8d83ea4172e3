# Sourced by device scripts after device_env.sh: `run LABEL STEPS TIMEOUT FLAGS...` runs
# `layerslide train` (sequence 1024, 24 GiB cap unless the flags say otherwise) with its step log
# in $out/LABEL.jsonl, and `summary LOG` appends the run's median step after the first two
# (which carry compilation), GPU peak and host RSS to $out/log.txt.
logs=$out

summary() {  # the median step of a run's log after the first two (which carry compilation)
    python3 - "$1" <<'PY' | tee -a "$out/log.txt"
import json, statistics, sys
from pathlib import Path
path = Path(sys.argv[1])
logs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
    if path.exists() else []
if len(logs) < 3:
    print(f"{path.stem}: {len(logs)} steps logged, too few for a steady median")
    sys.exit()
steady = [log["step_s"] for log in logs[2:]]
median = statistics.median(steady)
tokens = logs[-1]["tokens_per_s"] * logs[-1]["step_s"]
print(f"{path.stem}: median {median:.3f} s/step over {len(steady)} steps, "
      f"{tokens / median:,.0f} tokens/s, GPU peak "
      f"{max(log['gpu_peak_bytes'] for log in logs) / 2**30:.2f} GiB, host RSS "
      f"{max(log['host_rss_bytes'] for log in logs) / 2**30:.1f} GiB, "
      f"losses {[round(log['loss'], 3) for log in logs]}")
PY
}

run() {  # label steps timeout flags...
    local label=$1 steps=$2 limit=$3
    shift 3
    echo "== $label: train $* --steps $steps" | tee -a "$out/log.txt"
    timeout "$limit" python3 -m layerslide.cli.main train --seq-len 1024 --gpu-memory 24GiB \
        --steps "$steps" --log-jsonl "$logs/$label.jsonl" "$@" 2>&1 \
        | grep -v "^step \|Warning: " | tail -3 | tee -a "$out/log.txt"
    summary "$logs/$label.jsonl"
}

