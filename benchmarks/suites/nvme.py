"""The NVMe tier: AdamW moments on disk against in RAM, measured, next to the simulator's
prediction for the disk speed measured in the same run (benchmarks/nvme_bench.py)."""

from benchmarks.registry import Case, Suite, step

SUITE = Suite(
    name="nvme",
    what="moments on the drive against in RAM (Llama-3.2-1B, micro-batch 8), measured vs "
         "predicted",
    current="benchmarks/results/nvme_2026-11-29",
    reproduce="one CUDA GPU and a local NVMe drive at --nvme-dir ($LAYERSLIDE_NVME_DIR) with "
              "~20 GB free",
    cases=(
        Case("moments", "moments_on_nvme 0 and 1, Llama-3.2-1B, micro-batch 8",
             (step("{python} benchmarks/nvme_bench.py --model llama-3.2-1b --fractions 0,1 "
                   "--nvme-dir {nvme_dir} --out {out}", timeout_s=600),)),
        Case("gpu-tests", "the NVMe tier's `-m gpu` tests (bit-identical to RAM)",
             (step("{python} -m pytest -q -m gpu -p no:cacheprovider tests/executor/test_nvme.py",
                   timeout_s=330),)),
    ),
)
