"""Does memory stay flat over a long run? `layerslide train` on a small Llama-shaped model with
checkpoints, then host RSS and GPU peak per window of steps from its step log.

    python benchmarks/probes/memory_flat.py --device cpu --steps 1000 --out results/memory_flat_cpu
"""

from __future__ import annotations

import argparse
import json
import tempfile
from itertools import pairwise
from pathlib import Path

from transformers import LlamaConfig

from layerslide.cli.main import main as layerslide

GIB = 2**30


def summarize(logs: list[dict], steps: int) -> list[dict]:
    """GPU peak and host RSS range per window of steps (the first step, warm-up, apart)."""
    edges = [1, max(2, steps // 10), steps // 2, steps]
    rows = []
    for lo, hi in pairwise(edges):
        part = logs[lo:hi]
        if not part:
            continue
        rows.append({"steps": f"{lo + 1}-{hi}",
                     "gpu_peak_gib": max(r["gpu_peak_bytes"] for r in part) / GIB,
                     "host_rss_min_gib": min(r["host_rss_bytes"] for r in part) / GIB,
                     "host_rss_max_gib": max(r["host_rss_bytes"] for r in part) / GIB,
                     "median_step_s": sorted(r["step_s"] for r in part)[len(part) // 2],
                     "last_loss": part[-1]["loss"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--checkpoint-every", type=int, default=250)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "steps.jsonl"
    log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                    max_position_embeddings=256).save_pretrained(tmp)
        argv = ["train", "--model", tmp, "--random-init", "--device", args.device,
                "--steps", str(args.steps), "--micro-batch", "2", "--seq-len", "128",
                "--lr", "1e-4", "--log-jsonl", str(log), "--checkpoint-dir",
                str(Path(tmp) / "ckpt"), "--checkpoint-every", str(args.checkpoint_every)]
        if layerslide(argv) != 0:
            raise SystemExit("layerslide train failed")
    logs = [json.loads(line) for line in log.read_text().splitlines()]
    rows = summarize(logs, args.steps)
    (args.out / "memory_flat.json").write_text(json.dumps(
        {"command": " ".join(["layerslide", *argv]), "rows": rows}, indent=1))
    lines = ["| steps | GPU peak GiB | host RSS GiB (min-max) | median step s | loss |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['steps']} | {r['gpu_peak_gib']:.3f} | {r['host_rss_min_gib']:.3f}-"
              f"{r['host_rss_max_gib']:.3f} | {r['median_step_s']:.4f} | {r['last_loss']:.3f} |"
              for r in rows]
    (args.out / "memory_flat.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
