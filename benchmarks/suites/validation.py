"""The simulator against the executor: calibrate this machine, then train and simulate each
configuration of benchmarks/validate_sim.py (CONFIGS) on that profile."""

from benchmarks.registry import Case, Suite, step
from benchmarks.suites._summaries import validation

CALIBRATE = step("{python} -m layerslide.cli.main calibrate --out {out}/calibrated.toml "
                 "--overwrite --disk-dir {nvme_dir}", timeout_s=300)
FULL = ("3b-mb1-w2-host,3b-mb8-w2-host,3b-mb8-tuned,1b-mb1-w2-host,1b-mb8-w2-host,"
        "1b-mb32-w2-gpu,1b-mb8-w2-nvme0.5,3b-mb32-w2-host,3b-mb16-w1-host,3b-mb4-w2-gpu,"
        "3b-mb8-w4-gpu,1b-mb8-w4-host,1b-mb8-w1-gpu,3b-mb64-w2-host")

SUITE = Suite(
    name="validation",
    what="predicted against measured step time, GPU and host memory over 14 configurations "
         "(Llama 3.2 1B/3B, micro-batch 1-64, windows 1/2/4, checkpoints GPU/host, tuned, NVMe)",
    current="benchmarks/results/validation_2026-11-30o/validation_summary.json",
    reproduce="one H200-class GPU with 128 GiB of host RAM and a local drive; ~10 min",
    cases=(
        Case("full", "a thorough calibrate, then all 14 configurations on that profile",
             (CALIBRATE,
              step("{python} benchmarks/validate_sim.py --profile {out}/calibrated.toml "
                   f"--configs {FULL} --steps 5 --warmup-steps 2 --min-steady-s 2 "
                   "--deadline 430 --nvme-dir {nvme_dir} --traces {out}/traces "
                   "--out {out}", timeout_s=600)),
             summarize=validation),
        Case("quick", "a thorough calibrate, then two 3B rows (micro-batch 1 and 8)",
             (CALIBRATE,
              step("{python} benchmarks/validate_sim.py --profile {out}/calibrated.toml "
                   "--configs 3b-mb1-w2-host,3b-mb8-w2-host --nvme-dir {nvme_dir} "
                   "--out {out}", timeout_s=300)),
             summarize=validation),
    ),
)
