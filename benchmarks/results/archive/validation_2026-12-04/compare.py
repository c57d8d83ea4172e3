"""Predicted against measured GPU memory per row: torch's allocated peak and the caching
allocator's reserve, on this checkout's simulator.

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
errors = {"allocated": [], "reserved": []}
for arg in sys.argv[1:]:
    rows_path, profile_path = arg.split("=")
    profile = load_profile(profile_path)
    for row in json.loads(Path(rows_path).read_text()):
        if row.get("model_override") or not row.get("measured_gpu_allocated_bytes"):
            continue
        config = row["config"]
        train = TrainSpec(micro_batch=config["micro_batch"], seq_len=row.get("seq_len", 1024),
                          grad_accum=config.get("grad_accum", 1))
        plan = build_plan(resolve_model(config["model"]), train, Policy.from_dict(row["policy"]),
                          num_steps=3)
        pred = simulate(plan, profile, gpu_memory_bytes=row.get("gpu_memory_bytes", 24 * GIB))
        line = f'{row["label"]:28s}'
        for name, predicted in (("allocated", pred.gpu_allocated_peak_bytes),
                                ("reserved", pred.gpu_reserved_bytes)):
            measured = row[f"measured_gpu_{name}_bytes"]
            errors[name].append(predicted / measured - 1)
            line += f" {name} {measured / GIB:5.2f} GiB {predicted / measured - 1:+6.1%}"
        print(line)
for name, found in errors.items():
    print(f"{name}: mean absolute {sum(map(abs, found)) / len(found):.1%}, "
          f"worst {max(found, key=abs):+.1%} over {len(found)} rows")
