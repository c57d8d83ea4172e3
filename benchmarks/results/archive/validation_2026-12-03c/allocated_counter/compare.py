"""Allocated-peak error per row: the ledger's bytes in use (before) against torch's held count.

Usage, from the repository root: python compare.py ROWS.json=PROFILE ..."""
import json
import sys
from pathlib import Path

from layerslide.hwprofiles import load_profile
from layerslide.planner.build import build_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.simulator.predict import simulate

GIB = 2**30

for arg in sys.argv[1:]:
    rows_path, profile_path = arg.split("=")
    profile = load_profile(profile_path)
    for row in json.loads(Path(rows_path).read_text()):
        measured = row.get("measured_gpu_allocated_bytes")
        if row.get("model_override") or not measured:
            continue
        config = row["config"]
        train = TrainSpec(micro_batch=config["micro_batch"], seq_len=row.get("seq_len", 1024),
                          grad_accum=config.get("grad_accum", 1))
        plan = build_plan(resolve_model(config["model"]), train, Policy.from_dict(row["policy"]),
                          num_steps=3)
        pred = simulate(plan, profile, gpu_memory_bytes=row.get("gpu_memory_bytes", 24 * GIB))
        in_use = pred.peak_bytes["gpu"] - pred.gpu_runtime_bytes
        held = pred.gpu_allocated_peak_bytes
        print(f'{row["label"]:32s} measured {measured / GIB:6.2f} ledger {in_use / measured - 1:+.1%}'
              f' held {held / measured - 1:+.1%}')
