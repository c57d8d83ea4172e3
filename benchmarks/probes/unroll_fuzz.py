"""Plan.unroll against build_plan over random policies and tiny models: the planner's repeatable
plan (build_repeatable_plan) unrolled to n steps must be the plan built for n steps.

    python benchmarks/probes/unroll_fuzz.py [COUNT] [SEED]   # each policy that differs, then a count
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import make_tiny_model

from layerslide.planner import TrainSpec, build_plan
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.settings import Policy


def canonical(plan) -> dict:
    data = plan.to_dict()
    data["tasks"] = sorted(data["tasks"], key=lambda t: t["id"])
    data["edges"] = sorted(map(tuple, data["edges"]))
    data["buffers"] = sorted(data["buffers"], key=lambda b: b["id"])
    return data


def random_case(rng: random.Random) -> tuple[int, TrainSpec, dict]:
    window = rng.randint(1, 4)
    cast = rng.choice(["cpu_once", "cpu_per_load", "gpu"])
    settings = {
        "window": window, "prefetch_depth": rng.randint(1, window),
        "grad_buffers": rng.randint(1, 6), "activations": rng.choice(["gpu", "host", "nvme"]),
        "cast": cast, "moments_on_nvme": rng.choice([0.0, 0.5, 1.0]),
        "master_on_nvme": rng.choice([0.0, 0.5]) if cast == "cpu_once" else 0.0,
        "nvme_prefetch": rng.randint(1, 12), "resident_layers": rng.randint(0, 2),
        "gpu_updated_blocks": rng.randint(0, 3), "host_grad_buffers": rng.choice([None, 1, 2, 5]),
        "cpu_optimizer": rng.choice(["native", "torch"]),
        "optimizer_order": rng.choice(["arrival", "deadline"]),
        "cast_worker": rng.choice([False, True]),
    }
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=rng.choice([1, 1, 2, 3]),
                      max_grad_norm=rng.choice([None, 1.0]))
    return rng.randint(1, 5), train, settings


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    differ = 0
    for _ in range(count):
        layers, train, settings = random_case(rng)
        model, policy = make_tiny_model(layers), Policy.of(**settings)
        base = build_repeatable_plan(model, train, policy)
        steps = base.num_steps + rng.randint(1, 4)
        if canonical(base.unroll(steps)) != canonical(build_plan(model, train, policy,
                                                                 num_steps=steps)):
            differ += 1
            print(f"DIFFERS: {layers} layers, {train}, {settings}, {steps} steps")
    print(f"{count - differ} of {count} unrolled plans equal the plan built for their steps")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
