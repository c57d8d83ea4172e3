"""Host RSS after each block of steps, against the RSS after a 200-step warm-up: does it keep
growing, or level off? A tiny Llama on the CPU, no trace kept.

    .venv/bin/python benchmarks/probes/rss_growth.py --segment-steps 16 --steps 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import SEQ, VOCAB, spec_of, tiny_config

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.memory import host_rss_bytes
from layerslide.executor.optim import OptimConfig
from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment-steps", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=4)
    args = ap.parse_args()
    config = tiny_config("llama")
    spec = spec_of(config, Path(tempfile.mkdtemp()))
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(), device="cpu", keep_trace=False,
                 segment_steps=args.segment_steps) as trainer:
        trainer.init_random(0)
        data = SyntheticTokens(VOCAB, SEQ)
        trainer.fit(data, 200)
        base = host_rss_bytes()
        for k in range(args.blocks):
            trainer.fit(data, args.steps // args.blocks)
            grown = (host_rss_bytes() - base) / 2**20
            print(f"segment_steps {args.segment_steps}: after {(k + 1) * args.steps // args.blocks}"
                  f" more steps, RSS +{grown:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
