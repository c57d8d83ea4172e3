#!/usr/bin/env bash
# One device call: the executor's GPU tests, then the step-time benchmark. Usage (on the H200
# benchmark machine, from the repo root, with simpy's wheel in .whl/):
#   bash benchmarks/run_executor_gpu.sh "$OUT" [benchmark args...]
set -uo pipefail
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$(pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/machine.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/executor/test_trainer.py 2>&1 \
    | tail -15 | tee "$out/gpu_tests.txt"
python3 benchmarks/executor_bench.py --out "$out" "$@" 2>&1 | tee "$out/bench.log"
