#!/usr/bin/env bash
# The executor benchmark across micro-batches on the H200 benchmark machine (one device call):
#   bash benchmarks/run_executor_sweep.sh "$OUT"
set -uo pipefail
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$(pwd)
export PYTHONUNBUFFERED=1
python3 benchmarks/executor_bench.py --out "$out" --batches 1,2,4,8,16,32,64 --steps 4 \
    --trace-batch 8 "$@" 2>&1 | tee "$out/bench.log"
