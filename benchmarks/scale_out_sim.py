"""Simulated scale-out (issue 53): tokens/s and the bound of each model on 1 to 8 GPUs of one
host, every rank with the same sequences per step (weak scaling, as data-parallel runs report).

    python benchmarks/scale_out_sim.py --out DIR [--quick] [--tuned]

Rows: Llama-3.1-70B and Mistral-Large-123B on the RTX 4090 desktop (1 GPU), the two-4090
desktop and the four-4090 workstation, and on the H100 SXM hosts; Llama-3.2-3B and
Llama-3.1-8B on the H200 hosts with 24 GiB of each GPU. Each host runs at 1 GPU too, the
baseline of its speedups. A row's settings are the fastest of a small fixed search (window x
micro-batch, layer-major accumulation to SEQUENCES_PER_RANK, fp32 moments), each with the least
NVMe use that fits the host (STATE_LADDER). --tuned: each row is instead `tune`'s pick for
the ranks (`whatif --gpu-counts`' search space: its token cap counts every rank's tokens, so
more ranks accumulate less each). Writes DIR/scale_out.json and DIR/scale_out.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.planner.build import static_buffers
from layerslide.simulator import simulate, static_rejection
from layerslide.tuner import tune
from layerslide.tuner.whatif import WHATIF_SPACE

GIB = 1024**3
SEQ_LEN = 1024
SEQUENCES_PER_RANK = 32  # per rank per optimizer step: micro-batch x accumulation
# Where the state goes, least NVMe first: the first that fits the host is taken (moments in
# quarters, then master weights in halves, then checkpoints, then the bf16 weights).
STATE_LADDER = (
    {},
    *({"moments_on_nvme": f} for f in (0.25, 0.5, 0.75, 1.0)),
    *({"moments_on_nvme": 1.0, "master_on_nvme": f} for f in (0.5, 1.0)),
    {"moments_on_nvme": 1.0, "master_on_nvme": 1.0, "activations": "nvme"},
    {"moments_on_nvme": 1.0, "master_on_nvme": 1.0, "weights_on_nvme": 1.0,
     "activations": "nvme"},
)
# the speedup targets where one GPU is GPU-bound; else the plan within this of its bound
SPEEDUP_TARGETS = {2: 1.8, 4: 3.4}
BOUND_TARGET = 0.9


@dataclass(frozen=True)
class Family:
    name: str
    models: tuple[str, ...]
    hosts: tuple[tuple[str, tuple[int, ...]], ...]  # (profile, GPUs per host to run)
    micro_batches: tuple[int, ...]
    windows: tuple[int, ...]
    gpu_memory_bytes: int | None = None


FAMILIES = (
    Family("RTX 4090", ("llama-3.1-70b", "mistral-large-123b"),
           (("rtx4090-256gb", (1,)), ("rtx4090x2-desktop", (1, 2)),
            ("rtx4090x4-workstation", (1, 2, 4))), micro_batches=(1, 2), windows=(2, 3)),
    Family("H100 SXM", ("llama-3.1-70b", "mistral-large-123b"),
           (("h100-sxm", (1,)), ("h100-sxm-x2", (1, 2)), ("h100-sxm-x4", (1, 4)),
            ("h100-sxm-x8", (1, 2, 4, 8))), micro_batches=(2, 4, 8), windows=(2, 4)),
    Family("H200, 24 GiB per GPU", ("llama-3.2-3b", "llama-3.1-8b"),
           (("h200-bench", (1,)), ("h200-x2", (1, 2)), ("h200-x4", (1, 4)),
            ("h200-x8", (1, 2, 4, 8))), micro_batches=(4, 8, 16), windows=(2, 4),
           gpu_memory_bytes=24 * GIB),
)


def candidates(family: Family, quick: bool):
    """(window, micro-batch) pairs of the search; --quick: the first of each."""
    windows = family.windows[:1] if quick else family.windows
    micro = family.micro_batches[:1] if quick else family.micro_batches
    return [(w, m) for w in windows for m in micro]


def fitting_prediction(model, train, window, profile, cap):
    """(policy, prediction) of the least NVMe use that fits the host, or (None, the last
    misfit's reason): static buffers checked first, then the simulated peaks."""
    reason = "no placement fits"
    for state in STATE_LADDER:
        policy = Policy.of(window=window, accumulation="layer_major", **state)
        early = static_rejection(static_buffers(model, train, policy),
                                 train.global_tokens_per_step, profile, gpu_memory_bytes=cap,
                                 ranks_per_host=train.gpus)
        if early is not None:
            reason = early.reason
            continue
        pred = simulate(build_plan(model, train, policy, num_steps=3), profile,
                        gpu_memory_bytes=cap)
        if pred.feasible:
            return policy, pred
        reason = pred.reason
    return None, reason


def best_row(model_name: str, family: Family, profile_name: str, gpus: int,
             quick: bool) -> dict:
    """The fastest feasible candidate on the host with `gpus` ranks, as a table row."""
    model, profile = PRESETS[model_name], load_profile(profile_name)
    best, tried = None, []
    for window, micro in candidates(family, quick):
        train = TrainSpec(micro_batch=micro, seq_len=SEQ_LEN, gpus=gpus,
                          grad_accum=SEQUENCES_PER_RANK // micro)
        policy, pred = fitting_prediction(model, train, window, profile,
                                          family.gpu_memory_bytes)
        if policy is None:
            tried.append({"window": window, "micro_batch": micro, "fits": False,
                          "reason": pred})
            continue
        tried.append({"window": window, "micro_batch": micro, "fits": True,
                      "tokens_per_s": pred.tokens_per_s})
        if best is None or pred.tokens_per_s > best[2].tokens_per_s:
            best = (train, policy, pred)
    row = {"family": family.name, "model": model_name, "profile": profile_name, "gpus": gpus,
           "tried": tried}
    if best is None:
        return {**row, "feasible": False}
    return {**row, **_settings_row(*best)}


def tuned_row(model_name: str, family: Family, profile_name: str, gpus: int) -> dict:
    """tune's pick on the host with `gpus` ranks (whatif's space), as a table row."""
    model, profile = PRESETS[model_name], load_profile(profile_name)
    result = tune(model, profile, seq_len=SEQ_LEN, space=WHATIF_SPACE,
                  gpu_memory_bytes=family.gpu_memory_bytes, gpus=gpus, with_plan=False)
    row = {"family": family.name, "model": model_name, "profile": profile_name, "gpus": gpus,
           "tuned": True, "searched": result.searched}
    if result.best is None:
        return {**row, "feasible": False}
    return {**row, **_settings_row(result.best.train, result.best.policy,
                                   result.best.prediction)}


def _settings_row(train: TrainSpec, policy: Policy, pred) -> dict:
    residency = policy.residency
    return {"feasible": True, "micro_batch": train.micro_batch,
            "grad_accum": train.grad_accum, "window": residency.window,
            "activations": residency.activations, "moments_on_nvme": residency.moments_on_nvme,
            "master_on_nvme": residency.master_on_nvme,
            "weights_on_nvme": residency.weights_on_nvme,
            "step_s": pred.step_s, "tokens_per_step": pred.tokens_per_step,
            "tokens_per_s": pred.tokens_per_s, "mfu": pred.mfu, "bound": pred.bound,
            "bound_share_of_step": pred.bound_share, "floors_s": pred.floors_s,
            "peak_bytes_per_host": pred.peak_bytes_per_host,
            "limits_bytes": pred.limits_bytes}


def with_speedups(rows: list[dict]) -> list[dict]:
    """Each row's speedup over the same model on the same host at one GPU, and the issue's
    target for it: the speedup where that one GPU was GPU-bound, else the bound's share."""
    base = {(r["model"], r["profile"]): r for r in rows if r["gpus"] == 1 and r["feasible"]}
    out = []
    for r in rows:
        one = base.get((r["model"], r["profile"]))
        if not r["feasible"] or one is None:
            out.append(r)
            continue
        speedup = r["tokens_per_s"] / one["tokens_per_s"]
        if r["gpus"] == 1:
            target = None
        elif one["bound"] == "GPU compute":
            need = SPEEDUP_TARGETS.get(r["gpus"])
            target = None if need is None else (f">= {need}x", speedup >= need)
        else:
            target = (f"bound within {1 - BOUND_TARGET:.0%}",
                      r["bound_share_of_step"] >= BOUND_TARGET)
        out.append({**r, "speedup": speedup, "one_gpu_bound": one["bound"],
                    "target": None if target is None else target[0],
                    "target_met": None if target is None else target[1]})
    return out


def markdown(rows: list[dict]) -> str:
    lines = [("| model | host | GPUs | settings | tokens/s | x 1 GPU | bound (share of step) "
              "| per host: RAM, NVMe (GiB) | target |"),
             "| --- | --- | --- | --- | ---: | ---: | --- | ---: | --- |"]
    for r in rows:
        if not r["feasible"]:
            lines.append(f"| {r['model']} | {r['profile']} | {r['gpus']} | - | does not fit "
                         "| | | | |")
            continue
        nvme = ", ".join(f"{k.split('_')[0]} {r[k]:g}" for k in (
            "moments_on_nvme", "master_on_nvme", "weights_on_nvme") if r[k]) or "none"
        settings = (f"mb {r['micro_batch']} x {r['grad_accum']}, window {r['window']}, "
                    f"NVMe: {nvme}, act. {r['activations']}")
        target = ("" if r.get("target") is None
                  else f"{r['target']}: {'met' if r['target_met'] else 'MISSED'}")
        used, limit = r["peak_bytes_per_host"], r["limits_bytes"]
        memory = (f"{used['host'] / GIB:.0f} / {limit['host'] / GIB:.0f}, "
                  f"{used['nvme'] / GIB:.0f} / {limit['nvme'] / GIB:.0f}")
        lines.append(f"| {r['model']} | {r['profile']} | {r['gpus']} | {settings} | "
                     f"{r['tokens_per_s']:,.0f} | {r.get('speedup', 1.0):.2f} | {r['bound']} "
                     f"({r['bound_share_of_step']:.0%}) | {memory} | {target} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--quick", action="store_true",
                        help="one candidate per row (a smoke run, not the table)")
    parser.add_argument("--families", help="comma-separated family names to run (default all)")
    parser.add_argument("--tuned", action="store_true",
                        help="each row tune's pick for its ranks instead of the fixed search")
    args = parser.parse_args()
    chosen = set(args.families.split(",")) if args.families else None
    rows = []
    for family in FAMILIES:
        if chosen and family.name not in chosen:
            continue
        for model in family.models:
            for profile, counts in family.hosts:
                for gpus in counts:
                    start = time.perf_counter()
                    rows.append(tuned_row(model, family, profile, gpus) if args.tuned
                                else best_row(model, family, profile, gpus, args.quick))
                    print(f"{model} on {profile} x{gpus}: "
                          f"{rows[-1].get('tokens_per_s') or 0:,.0f} tokens/s "
                          f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    rows = with_speedups(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(sys.argv)
    (args.out / "scale_out.json").write_text(json.dumps({"command": command, "rows": rows},
                                                        indent=1) + "\n")
    (args.out / "scale_out.md").write_text(f"`{command}`\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
