"""How long build_plan and build_plan + simulate take for Mistral-Large-123B (micro-batch 4, all
state on NVMe, rtx4090-256gb), mean of N runs. Run it under two versions of the package to
compare them side by side:

    python benchmarks/probes/plan_build_speed.py 5
    PYTHONPATH=OLD_TREE python benchmarks/probes/plan_build_speed.py 5
"""

from __future__ import annotations

import sys
import time

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    model, train = PRESETS["mistral-large-123b"], TrainSpec(micro_batch=4)
    settings = {"moments_on_nvme": 1.0, "master_on_nvme": 1.0}
    policy = Policy.of(**settings) if hasattr(Policy, "of") else Policy(**settings)
    profile = load_profile("rtx4090-256gb")
    start = time.perf_counter()
    for _ in range(runs):
        build_plan(model, train, policy)
    build_s = (time.perf_counter() - start) / runs
    start = time.perf_counter()
    for _ in range(runs):
        simulate(build_plan(model, train, policy), profile)
    both_s = (time.perf_counter() - start) / runs
    print(f"build_plan {build_s * 1e3:.1f} ms, build_plan + simulate {both_s * 1e3:.1f} ms "
          f"(mean of {runs})")


if __name__ == "__main__":
    main()
