"""Compact AdamW moments (bf16, int8) against fp32: training quality on real text, step time
and host memory (benchmarks/run_moments_gpu.sh, benchmarks/moment_quality.py)."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="moments",
    what="bf16 / int8 AdamW moments vs fp32: held-out loss, 3B step time, 8B RAM per param",
    current="benchmarks/results/moments_2026-12-02/README.md",
    reproduce="one CUDA GPU, 128 GiB RAM; each case fits a 10-minute call",
    cases=(
        Case("quality", "a ~30M Llama trained on the stdlib's sources per moment precision",
             (step("{python} benchmarks/moment_quality.py --out {out}/quality "
                   "--precisions fp32,bf16,int8", timeout_s=580),)),
        Case("speed", "Llama-3.2-3B, micro-batch 8 and 1, fp32 / bf16 / int8 moments",
             (step("bash benchmarks/run_moments_gpu.sh speed", timeout_s=600),)),
        Case("capacity", "Llama-3.1-8B all in RAM, lean policy: host RSS per billion params",
             (step("bash benchmarks/run_moments_gpu.sh capacity", timeout_s=600),)),
    ),
)
