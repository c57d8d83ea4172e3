"""layerslide against DeepSpeed ZeRO-3 CPU offload and all-GPU PyTorch, side by side
(benchmarks/compare_offload.py): Llama-3.2-3B shape, sequence 1024, GPU capped at 24 GiB,
each run in a fresh process; a quick calibrate first bounds each layerslide row by this
machine's host memory."""

from benchmarks.registry import Case, Suite, step
from benchmarks.suites._summaries import compare

QUICK_CALIBRATE = step("{python} -m layerslide.cli.main calibrate --quick "
                       "--out {out}/calibrated.toml --overwrite", timeout_s=120)
COMPARE = ("{python} benchmarks/compare_offload.py --out {out} --floor-profile {profile} "
           "--profile {profile} ")

SUITE = Suite(
    name="compare",
    what="layerslide vs DeepSpeed ZeRO-3 offload vs all-GPU PyTorch, Llama-3.2-3B, 24 GiB cap",
    current="benchmarks/results/compare_2026-11-30g/compare.json",
    reproduce="one H200-class GPU, 128 GiB RAM, DeepSpeed's sdist and its small dependencies "
              "in the --wheels folder; ~8 min",
    cases=(
        Case("default", "default policy against DeepSpeed at micro-batch 1 and 8, 10 steps",
             (QUICK_CALIBRATE,
              step(COMPARE + "--systems deepspeed,layerslide --micro-batches 1,8 --steps 10 "
                   "--deadline 330 --host-limit 115GiB", timeout_s=420)),
             packages=("deepspeed",), summarize=compare),
        Case("tuned", "tune's pick under half of DeepSpeed's GPU allocation, micro-batch 8,4,1",
             (QUICK_CALIBRATE,
              step(COMPARE + "--systems deepspeed,layerslide,layerslide-tuned "
                   "--micro-batches 8,4,1 --tune-share-of-deepspeed 0.5 --deadline 470 "
                   "--steps 4 --host-limit 115GiB", timeout_s=560)),
             packages=("deepspeed",), summarize=compare),
        Case("all-gpu", "all-GPU PyTorch and layerslide at micro-batch 1, 4, 8, 16, 32",
             (QUICK_CALIBRATE,
              step(COMPARE + "--systems layerslide,torch --micro-batches 1,4,8,16,32 "
                   "--steps 6 --deadline 470", timeout_s=560)),
             summarize=compare),
    ),
)
