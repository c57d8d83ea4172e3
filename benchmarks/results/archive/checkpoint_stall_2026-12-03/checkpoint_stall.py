"""How long a checkpoint pauses training, in one Trainer, five ways side by side: written
synchronously (the pipeline waits), beside training into fresh copy buffers (their pages faulted
in as they are copied), and beside training into buffers kept ahead (Trainer.keep_checkpoint_
copies), the same written through the page cache, and kept again. A mode's stall is the extra wall time of a fixed run of steps that starts with its
checkpoint, over the mean of the plain runs just before and after it. Then one state is
checkpointed synchronously to store A and beside the next steps to store B, and the two
compared file by file (the bytes must match)."""

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

from layerslide.executor.blocks import hf_config_from_spec
from layerslide.executor.checkpoint_store import CheckpointStore
from layerslide.executor.data import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.executor.trainer import Trainer
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import resolve_model
from layerslide.planner.settings import Policy, TrainSpec

# kept_buffered: kept copies written through the page cache (as before O_DIRECT writes)
MODES = ("sync", "fresh", "kept", "kept_buffered", "kept_again")


def digest(path: Path) -> dict:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())
            if f.name != "manifest.json"}


def timed_fit(trainer, data, steps) -> float:
    start = time.monotonic()
    trainer.fit(data, steps)
    return time.monotonic() - start


def with_checkpoint(trainer, data, store, mode, steps) -> dict:
    """Wall time of `steps` steps that start with a checkpoint written the `mode` way."""
    if mode == "fresh":
        trainer.drop_checkpoint_copies()
    kept_bytes = trainer.keep_checkpoint_copies() if mode.startswith("kept") else 0
    start = time.monotonic()
    if mode == "sync":
        info = trainer.save_state(store, data)
        write_s, updates_s, copied = time.monotonic() - start, None, 0
        trainer.fit(data, steps)
    else:
        snapshot = trainer.start_save_state(store, data)
        trainer.fit(data, steps)  # ends by waiting for the write, if still on
        info = store.latest()
        write_s, updates_s = snapshot.write_s, snapshot.stall_s
        copied = snapshot.guard.copied_bytes
    return {"with_checkpoint_s": time.monotonic() - start, "write_s": write_s,
            "updates_waited_or_copied_s": updates_s, "copied_gb": copied / 1e9,
            "kept_ahead_gb": kept_bytes / 1e9, "checkpoint_gb": info.total_bytes / 1e9,
            "step": info.step}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpt-stall"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    spec = resolve_model(args.model)
    plan = build_repeatable_plan(spec, TrainSpec(micro_batch=args.micro_batch,
                                                 seq_len=args.seq_len), Policy.of())
    results = {"modes": {}}
    shutil.rmtree(args.dir, ignore_errors=True)
    with Trainer(config=hf_config_from_spec(spec), plan=plan, optim=OptimConfig(lr=1e-5),
                 device=args.device, segment_steps=16, gpu_memory_bytes=24 << 30,
                 keep_trace=False) as trainer:
        trainer.init_random(0)
        data = SyntheticTokens(spec.vocab_size, args.seq_len, seed=1)
        trainer.fit(data, 4)  # compiles, warms the allocator
        plain = [timed_fit(trainer, data, args.steps)]
        for mode in MODES:
            store = CheckpointStore(args.dir / mode, keep_last=1,
                                    direct_writes=mode != "kept_buffered")
            row = with_checkpoint(trainer, data, store, mode, args.steps)
            plain.append(timed_fit(trainer, data, args.steps))
            row["plain_s"] = plain[-2:]
            row["stall_s"] = row["with_checkpoint_s"] - sum(plain[-2:]) / 2
            results["modes"][mode] = row
            print(mode, json.dumps(row), flush=True)
            shutil.rmtree(args.dir / mode)
        sync_info = trainer.save_state(CheckpointStore(args.dir / "a", keep_last=1), data)
        snapshot = trainer.start_save_state(CheckpointStore(args.dir / "b", keep_last=1), data)
        trainer.fit(data, 20)
        snapshot.wait()
        background_info = CheckpointStore(args.dir / "b", keep_last=1).latest()
        a, b = digest(sync_info.path), digest(background_info.path)
    modes = results["modes"]
    results.update(steps=args.steps, same_state_steps=[sync_info.step, background_info.step],
                   files_differing=sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n)))
    results["same_bytes"] = not results["files_differing"]
    results["stall_ratio"] = {m: modes[m]["stall_s"] / modes["sync"]["stall_s"]
                              for m in MODES[1:]}
    print(f"stall against the synchronous checkpoint's {modes['sync']['stall_s']:.2f} s: "
          + ", ".join(f"{m} {modes[m]['stall_s']:.2f} s ({results['stall_ratio'][m]:.3f}x)"
                      for m in MODES[1:])
          + f"; one state checkpointed both ways byte-identical: {results['same_bytes']} "
          f"({len(a)} files, differing: {results['files_differing'][:8]})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoint_stall.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
