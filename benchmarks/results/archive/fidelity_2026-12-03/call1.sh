#!/usr/bin/env bash
# One device call: the checkpoint stall (issue 25), then two of issue 26's rows.
here=benchmarks/results
OUT=$OUT/checkpoint_stall bash $here/checkpoint_stall_2026-12-02/checkpoint_stall_gpu.sh
OUT=$OUT/fidelity ROW_TIMEOUT=110 bash $here/fidelity_2026-12-03/fidelity_gpu.sh \
    mistral7b_mb8 llama8b_mb16
