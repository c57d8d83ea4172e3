"""The executor's step time per micro-batch next to its floor, every input measured in the
same run (benchmarks/executor_bench.py); Llama-3.2-3B shape, random weights, 24 GiB cap."""

from benchmarks.registry import Case, Suite, step
from benchmarks.suites._summaries import executor

SUITE = Suite(
    name="executor",
    what="executor s/step per micro-batch against its measured floor, predicted vs measured "
         "trace",
    current="benchmarks/results/executor_sweep_2026-11-29/executor_bench.json",
    reproduce="one H200-class GPU, 128 GiB RAM; ~5 min a case",
    cases=(
        Case("gpu-tests", "the executor's `-m gpu` tests (reference match, serial == lanes)",
             (step("{python} -m pytest -q -m gpu -p no:cacheprovider "
                   "tests/training/test_trainer.py", timeout_s=330),)),
        Case("sweep", "default policy, micro-batch 1-64, trace at micro-batch 8",
             (step("{python} benchmarks/executor_bench.py --out {out} "
                   "--batches 1,2,4,8,16,32,64 --steps 4 --trace-batch 8", timeout_s=600),),
             summarize=executor),
        Case("tuned", "tune's pick per micro-batch (under 90% of the cap) on the profile",
             (step("{python} benchmarks/executor_bench.py --out {out} --policy tuned "
                   "--tune-cap-fraction 0.9 --profile {profile} --batches 8,4 --steps 4 "
                   "--trace-batch 8", timeout_s=600),),
             profile="h200-bench", summarize=executor),
        Case("optimizers", "native against torch CPU AdamW at micro-batch 8 and 1",
             (step("{python} benchmarks/executor_bench.py --out {out} --batches 8,1 "
                   "--optimizers native,torch --steps 4 --trace-batch 8", timeout_s=600),),
             summarize=executor),
    ),
)
