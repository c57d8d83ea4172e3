"""Peak host RSS of a short training run next to the plan's host peak, for one model and policy.

Meant to be run once per checkout (PYTHONPATH picks the package) to see what a change to the
host buffers does to the real process, e.g. grads landing in the upload copies:

    PYTHONPATH=. python benchmarks/probes/host_rss_bench.py --device cpu --model CONFIG_DIR
    PYTHONPATH=/tmp/before python benchmarks/probes/host_rss_bench.py --device cpu --model CONFIG_DIR
"""

from __future__ import annotations

import argparse
import json

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.blocks import hf_config_from_spec
from layerslide.executor.optim import OptimConfig
from layerslide.hwprofiles import load_profile
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.simulator.predict import simulate
from layerslide.training.trainer import Trainer

GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b", help="preset or config.json folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--profile", default="h200-bench")
    args = ap.parse_args()
    spec = resolve_model(args.model)
    train = TrainSpec(micro_batch=args.micro_batch, seq_len=args.seq_len)
    policy = Policy.of()
    with Trainer(config=hf_config_from_spec(spec), plan=build_plan(spec, train, policy),
                 optim=OptimConfig(lr=1e-5), device=args.device, keep_trace=False) as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(spec.vocab_size, args.seq_len), args.steps)
        state_bytes = trainer.state.state_bytes()
    plan = build_plan(spec, train, policy, num_steps=3)
    predicted = simulate(plan, load_profile(args.profile)).peak_bytes["host"]
    print(json.dumps({
        "model": spec.name, "params": spec.total_params, "device": args.device,
        "host_rss_peak_gib": max(log.host_rss_bytes for log in logs) / GIB,
        "host_state_gib": state_bytes / GIB, "predicted_host_peak_gib": predicted / GIB,
        "losses": [log.loss for log in logs]}))


if __name__ == "__main__":
    main()
