"""Where the best-first pick differs from the exhaustive one (a planning_speed.json), is it the
pick the exhaustive search makes when it gives the later stages (fill, settled clock, niceness)
to every candidate rather than to its 16 sweep leaders?

    python benchmarks/probes/planning_all_staged.py benchmarks/results/planning-speed/DIR/quality/planning_speed.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.planning_speed import GIB, SPACES
from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS
from layerslide.tuner import exhaustive, tune


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="a planning_speed.json")
    args = parser.parse_args()
    cases = [c for c in json.loads(Path(args.record).read_text())["cases"] if not c["identical"]]
    exhaustive.FILL_FINALISTS = exhaustive.CLOCK_FINALISTS = 10**9  # every candidate
    for c in cases:
        model, profile = PRESETS[c["model"]], load_profile(c["profile"])
        options = {"space": SPACES[c["space"]], "workers": 1,
                   "gpu_memory_bytes": c["gpu_cap_gib"] * GIB if c["gpu_cap_gib"] else None}
        every = tune(model, profile, exhaustive=True, **options).best
        fast = tune(model, profile, **options).best
        same = ((every.train, every.policy, every.prediction.tokens_per_s)
                == (fast.train, fast.policy, fast.prediction.tokens_per_s))
        print(f"{c['model']} on {c['profile']} cap {c['gpu_cap_gib']} {c['space']}: exhaustive "
              f"(16 leaders staged) {c['exhaustive']['tokens_per_s']:.3f}, every candidate "
              f"staged {every.prediction.tokens_per_s:.3f}, best-first "
              f"{fast.prediction.tokens_per_s:.3f}; best-first = every staged: {same}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
