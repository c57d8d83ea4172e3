"""The kernels a step is made of: the LM head's fused linear cross-entropy against PyTorch
and liger-kernel (benchmarks/head_bench.py), one decoder layer eager and compiled
(benchmarks/layer_kernels_bench.py), compiled against eager layers in the executor, and the
native CPU AdamW per moment precision (benchmarks/moment_kernels_bench.py)."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="kernels",
    what="the head's loss, a decoder layer's kernels, compiled vs eager steps, the CPU AdamW",
    current="benchmarks/results/kernels_2026-11-29/head_bench.json",
    reproduce="one CUDA GPU (liger-kernel in --wheels for its row); `adamw` runs on any CPU",
    cases=(
        Case("head", "the head's loss + grads: torch, liger, chunked, layerslide's Triton kernel",
             (step("{python} -m pytest -q -m gpu -p no:cacheprovider tests/kernels",
                   timeout_s=300),
              step("{python} benchmarks/head_bench.py --out {out}", timeout_s=300))),
        Case("layer", "one 3B decoder layer, eager (by kernel family) and compiled, mb 4/8/64",
             (step("{python} benchmarks/layer_kernels_bench.py --variant eager "
                   "--micro-batches 4 8 64 --out {out}", timeout_s=200),
              step("{python} benchmarks/layer_kernels_bench.py --variant compile "
                   "--micro-batches 4 8 64 --out {out}", timeout_s=200))),
        Case("compiled-vs-eager", "the executor's step with compiled and eager layers, mb 64, 8",
             (step("{python} benchmarks/executor_bench.py --batches 64,8 "
                   "--layer-kernels compiled,eager --steps 5 --trace-batch 0 --out {out}",
                   timeout_s=600),)),
        Case("adamw", "the native one-pass AdamW per moment precision (fp32, bf16, int8)",
             (step("{python} benchmarks/moment_kernels_bench.py --json {out}/kernels.json",
                   timeout_s=300),),
             needs="cpu"),
    ),
)
