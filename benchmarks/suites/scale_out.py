"""Simulated scale-out (issue 53, benchmarks/scale_out_sim.py): tokens/s and the bound of 70B
and 123B on 1-4 RTX 4090s and 1-8 H100 SXM, and of 3B and 8B on 1-8 H200 at 24 GiB per GPU,
each host also at one GPU for its speedups. CPU only: predictions, not measurements."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="scale-out",
    what="simulated tokens/s, speedup and bound on 1-8 GPUs of one host (CPU)",
    current="benchmarks/results/scale-out/2026-12-05-1993fbf/simulate/scale_out.json",
    reproduce="any machine; ~15 min on 2 cores",
    cases=(
        Case("simulate", "the fastest of a small fixed search per model, host and GPU count",
             (step("{python} benchmarks/scale_out_sim.py --out {out}", timeout_s=3600),),
             needs="cpu"),
        Case("tuned", "tune's pick per model, host and GPU count (whatif --gpu-counts' space)",
             (step("{python} benchmarks/scale_out_sim.py --tuned --out {out}", timeout_s=3600),),
             needs="cpu"),
    ),
)
