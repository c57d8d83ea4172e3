"""The simulator against the executor: calibrate this machine, then train and simulate each
configuration of benchmarks/validate_sim.py (CONFIGS) on that profile."""

from benchmarks.registry import Case, Suite, step
from benchmarks.suites._summaries import validation

CALIBRATE = step("{python} -m layerslide.cli.main calibrate --out {out}/calibrated.toml "
                 "--overwrite --disk-dir {nvme_dir}", timeout_s=300)
FULL = ("3b-mb1-w2-host,3b-mb8-w2-host,3b-mb8-tuned,1b-mb1-w2-host,1b-mb8-w2-host,"
        "1b-mb32-w2-gpu,1b-mb8-w2-nvme0.5,3b-mb32-w2-host,3b-mb16-w1-host,3b-mb4-w2-gpu,"
        "3b-mb8-w4-gpu,1b-mb8-w4-host,1b-mb8-w1-gpu,3b-mb64-w2-host")

# beyond the models the profile was fitted on (issue 26), one device call each: every row run
# twice (--repeats 2, rounds interleaved) so CPU-bound rows are judged against their own spread
BEYOND = {
    "beyond-llama8b": "8b-mb1-w2-host,8b-mb8-w2-host,8b-mb16-w2-host,8b-mb4x4-w2-host-lm,"
                      "8b-mb8-w2-host-gpu2",
    "beyond-mistral-qwen8b": "mistral7b-mb8-w2-host,mistral7b-mb32-w2-host,"
                             "mistral7b-mb16-w2-gpu,qwen8b-mb8-w2-host,qwen8b-mb8x4-w2-host-lm",
    "beyond-qwen4b": "qwen4b-mb1-w2-host,qwen4b-mb4-w2-gpu,qwen4b-mb32-w2-host,"
                     "qwen4b-mb4x4-w2-host,qwen4b-mb4x4-w2-host-lm,qwen4b-mb8-w2-nvme",
}


def _beyond(name: str, configs: str) -> Case:
    return Case(name, f"a thorough calibrate, then {configs.count(',') + 1} rows twice each",
                (CALIBRATE,
                 step("{python} benchmarks/validate_sim.py --profile {out}/calibrated.toml "
                      f"--configs {configs} --repeats 2 --steps 5 --warmup-steps 1 "
                      "--deadline 430 --nvme-dir {nvme_dir} --traces {out}/traces "
                      "--out {out}", timeout_s=600)),
                summarize=validation)


SUITE = Suite(
    name="validation",
    what="predicted against measured step time, GPU and host memory over 14 configurations "
         "(Llama 3.2 1B/3B, micro-batch 1-64, windows 1/2/4, checkpoints GPU/host, tuned, NVMe) "
         "and, beyond them, 16 of Llama-3.1-8B, Mistral-7B, Qwen3-4B/8B (accumulation step- "
         "and layer-major, GPU-updated blocks, checkpoints on NVMe), each run twice",
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
        *(_beyond(name, configs) for name, configs in BEYOND.items()),
    ),
)
