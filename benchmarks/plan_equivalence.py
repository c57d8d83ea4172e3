"""Predictions of a fixed list of configurations, written so that two versions of the planner and
simulator can be compared: step time, peaks and reserves exactly, and each trace as a digest of
its events with the task ids left out (a refactor may rename ids and kinds, not change times).

    python benchmarks/plan_equivalence.py --out before.json     # on one version
    python benchmarks/plan_equivalence.py --out after.json      # on the other
    python benchmarks/plan_equivalence.py --compare before.json after.json
    python benchmarks/plan_equivalence.py --golden OLD_GOLDEN.json --mapping-out MAP.json

--golden checks that the golden plan (tests/simulator/test_sim_golden.py) runs as an earlier
golden file says, its ids renamed by OLD_ID_RULES (the ids of plan format 1), and writes the
mapping of each old id to its new one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate

GIB = 1024**3
# Kinds one version split into several: an event's kind is compared through this map.
KIND_ALIASES = {"read_state": "nvme_read", "read_activation": "nvme_read",
                "write_state": "nvme_write", "write_activation": "nvme_write"}

_B = r"(L\d+|emb|head)"
# plan format 1's task ids -> format 2's (planner.plan.task_id)
OLD_ID_RULES = [
    (rf"^(s\d+)\.(optimizer_step|read_state|write_state|cast)\.{_B}$", r"\1.m0.\2.\3"),
    (r"^(s\d+)\.grad_norm$", r"\1.m0.grad_norm.head"),
    (rf"^(s\d+\.m\d+)\.(forward|backward|head)\.{_B}\.load\.cast$", r"\1.cast.\3.\2"),
    (rf"^(s\d+\.m\d+)\.(forward|backward|head)\.{_B}\.load$", r"\1.load_weights.\3.\2"),
    (rf"^(s\d+\.m\d+)\.ckpt\.{_B}\.offload$", r"\1.offload_activation.\2"),
    (rf"^(s\d+\.m\d+)\.ckpt\.{_B}\.fetch$", r"\1.fetch_activation.\2"),
    (rf"^(s\d+\.m\d+)\.ckpt\.{_B}\.nvme_write$", r"\1.write_activation.\2"),
    (rf"^(s\d+\.m\d+)\.ckpt\.{_B}\.nvme_read$", r"\1.read_activation.\2"),
]


def new_id(old: str) -> str:
    for pattern, replacement in OLD_ID_RULES:
        old = re.sub(pattern, replacement, old)
    return old


def check_golden(old_path: Path, mapping_out: Path | None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "simulator"))
    from test_sim_golden import event_rows, golden_prediction

    old = json.loads(old_path.read_text())
    _, prediction = golden_prediction()
    now = event_rows(prediction)
    renamed = [[new_id(e[0]), *e[1:]] for e in old["events"]]
    same = ([[str(x) for x in r[:2]] + r[2:] for r in now] == renamed
            and prediction.step_s == old["step_s"])
    print(f"golden trace: {len(now)} events, {'identical' if same else 'DIFFERENT'} up to the "
          f"renamed ids; step {prediction.step_s} s (was {old['step_s']})")
    if mapping_out is not None:
        mapping = {e[0]: new_id(e[0]) for e in old["events"]}
        mapping_out.write_text(json.dumps(mapping, indent=1) + "\n")
    return 0 if same else 1


# (name, model, profile, GPU cap in GiB or None, TrainSpec fields, Policy fields)
CONFIGS = [
    ("1b-mb1", "llama-3.2-1b", "h200-bench", 24, {"micro_batch": 1}, {}),
    ("1b-mb8", "llama-3.2-1b", "h200-bench", 24, {"micro_batch": 8}, {}),
    ("3b-mb1", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 1}, {}),
    ("3b-mb8", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8}, {}),
    ("3b-mb64", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 64}, {}),
    ("3b-mb8-tuned", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"window": 4, "activations": "gpu", "gpu_updated_blocks": 6}),
    ("3b-mb8-layers-first", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"gpu_updated_blocks": 4, "gpu_updated_order": "layers_first"}),
    ("3b-mb8-resident", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"resident_layers": 4}),
    ("3b-mb8-cast-gpu", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8}, {"cast": "gpu"}),
    ("3b-mb8-cast-per-load", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"cast": "cpu_per_load", "host_grad_buffers": 2}),
    ("3b-mb8-torch", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"cpu_optimizer": "torch"}),
    ("3b-mb8-torch-cast-worker", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"cpu_optimizer": "torch", "cast_worker": True}),
    ("3b-mb8-arrival", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"optimizer_order": "arrival"}),
    ("3b-mb8-clip", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8, "max_grad_norm": 1.0},
     {}),
    ("3b-mb4-accum4", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 4, "grad_accum": 4}, {}),
    ("3b-mb4-accum2-clip", "llama-3.2-3b", "h200-bench", 24,
     {"micro_batch": 4, "grad_accum": 2, "max_grad_norm": 1.0}, {"gpu_updated_blocks": 2}),
    ("3b-mb8-moments-half-nvme", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"moments_on_nvme": 0.5}),
    ("3b-mb8-all-nvme", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"moments_on_nvme": 1.0, "master_on_nvme": 0.5, "nvme_prefetch": 3}),
    ("3b-mb8-act-nvme", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"activations": "nvme"}),
    ("3b-mb8-eager-materialized", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 8},
     {"layer_kernels": "eager", "head_loss": "materialized", "window": 1, "prefetch_depth": 1}),
    ("8b-mb8", "llama-3.1-8b", "h200-bench", 24, {"micro_batch": 8}, {}),
    ("mistral-nemo-12b-nvme", "mistral-nemo-12b", "h200-bench", 24, {"micro_batch": 8},
     {"moments_on_nvme": 0.55}),
    ("70b-4090", "llama-3.1-70b", "rtx4090-256gb", 24, {"micro_batch": 2},
     {"moments_on_nvme": 1.0, "master_on_nvme": 1.0}),
    ("mistral-7b-a100-accum", "mistral-7b", "a100-80gb-pcie", None,
     {"micro_batch": 2, "grad_accum": 2}, {"window": 4, "prefetch_depth": 2}),
    ("qwen3-4b-5090-overflow", "qwen3-4b", "rtx5090", 8, {"micro_batch": 16},
     {"activations": "gpu"}),
    ("3b-mb4-lm16", "llama-3.2-3b", "h200-bench", 24, {"micro_batch": 4, "grad_accum": 16},
     {"accumulation": "layer_major"}),
    ("70b-4090-lm32-weights-nvme", "llama-3.1-70b", "rtx4090-256gb", 24,
     {"micro_batch": 1, "grad_accum": 32},
     {"accumulation": "layer_major", "moments_on_nvme": 1.0, "master_on_nvme": 0.5,
      "weights_on_nvme": 0.5, "activations": "nvme"}),
]


def event_digest(prediction) -> tuple[str, int]:
    """A hash of the trace's events without their ids, in time order, and their count."""
    rows = sorted((e.lane, KIND_ALIASES.get(str(e.kind), str(e.kind)), _block(e), e.step,
                   repr(e.start_s), repr(e.end_s)) for e in prediction.trace.events)
    memory = [(m.tier, repr(m.time_s), m.bytes_in_use) for m in prediction.trace.memory]
    text = json.dumps([rows, memory])
    return hashlib.sha256(text.encode()).hexdigest(), len(rows)


def _block(event) -> int:
    return getattr(event, "block", getattr(event, "layer", None))


def predict_all() -> dict:
    results = {}
    for name, model, profile, cap_gib, train, policy in CONFIGS:
        start = time.perf_counter()
        plan = build_plan(PRESETS[model], TrainSpec(**train), Policy.of(**policy), num_steps=3)
        cap = None if cap_gib is None else cap_gib * GIB
        p = simulate(plan, load_profile(profile), gpu_memory_bytes=cap)
        row = {"model": model, "profile": profile, "gpu_cap_gib": cap_gib, "train": train,
               "policy": policy, "tasks": plan.graph.number_of_nodes(),
               "buffers": len(plan.buffers), "step_s": p.step_s,
               "peak_bytes": p.peak_bytes, "gpu_reserved_bytes": p.gpu_reserved_bytes,
               "overflows": [str(o) for o in p.overflows], "floors_s": p.floors_s,
               "lane_busy": p.lane_busy, "gpu_speedup": p.gpu_speedup}
        if p.trace is not None:
            row["event_digest"], row["events"] = event_digest(p)
        results[name] = row
        print(f"{name}: {p.step_s} s/step, {time.perf_counter() - start:.1f} s to predict",
              file=sys.stderr)
    return results


def compare(before_path: Path, after_path: Path) -> int:
    before = json.loads(before_path.read_text())["configs"]
    after = json.loads(after_path.read_text())["configs"]
    differ = 0
    for name in before:
        a, b = before[name], after.get(name)
        if b is None:
            print(f"{name}: missing from {after_path}")
            differ += 1
            continue
        keys = [k for k in a if a[k] != b.get(k)]
        print(f"{name}: {'identical' if not keys else 'DIFFERS in ' + ', '.join(keys)}")
        differ += bool(keys)
    print(f"{len(before) - differ} of {len(before)} configurations identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the predictions here (JSON)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--golden", type=Path, help="an earlier golden_tiny.json to check")
    parser.add_argument("--mapping-out", type=Path, help="with --golden: write old -> new ids")
    args = parser.parse_args()
    if args.golden:
        return check_golden(args.golden, args.mapping_out)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    data = {"command": "python " + " ".join(sys.argv), "configs": predict_all()}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
