"""How long a checkpoint pauses training, written synchronously (the pipeline waits) against
written beside training (checkpoint_snapshot): the extra wall time of a fixed run of steps that
starts with the checkpoint, over the same run without one, in one Trainer. Then one state is
checkpointed both ways (synchronously to store A, then beside the next steps to store B) and
the two compared file by file: on the GPU the bytes must match as they do on the CPU."""

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


def digest(path: Path) -> dict:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())
            if f.name != "manifest.json"}


def timed_fit(trainer, data, steps) -> float:
    start = time.monotonic()
    trainer.fit(data, steps)
    return time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckpt-stall"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    spec = resolve_model(args.model)
    plan = build_repeatable_plan(spec, TrainSpec(micro_batch=args.micro_batch, seq_len=1024),
                                 Policy.of())
    results = {}
    shutil.rmtree(args.dir, ignore_errors=True)
    with Trainer(config=hf_config_from_spec(spec), plan=plan, optim=OptimConfig(lr=1e-5),
                 device=args.device, segment_steps=16, gpu_memory_bytes=24 << 30,
                 keep_trace=False) as trainer:
        trainer.init_random(0)
        data = SyntheticTokens(spec.vocab_size, 1024, seed=1)
        trainer.fit(data, 4)  # compiles, warms the allocator
        for mode in ("sync", "background"):
            store = CheckpointStore(args.dir / mode, keep_last=1)
            plain_s = timed_fit(trainer, data, args.steps)
            start = time.monotonic()
            if mode == "sync":
                info = trainer.save_state(store, data)
                write_s, updates_s = time.monotonic() - start, None
                trainer.fit(data, args.steps)
            else:
                snapshot = trainer.start_save_state(store, data)
                trainer.fit(data, args.steps)  # ends by waiting for the write, if still on
                info = store.latest()
                write_s, updates_s = snapshot.write_s, snapshot.stall_s
            with_s = time.monotonic() - start
            plain_after_s = timed_fit(trainer, data, args.steps)  # how far runs vary
            plain = (plain_s + plain_after_s) / 2
            results[mode] = {"steps": args.steps, "plain_s": [plain_s, plain_after_s],
                             "with_checkpoint_s": with_s, "stall_s": with_s - plain,
                             "write_s": write_s, "updates_waited_or_copied_s": updates_s,
                             "checkpoint_gb": info.total_bytes / 1e9, "step": info.step}
            print(mode, json.dumps(results[mode]), flush=True)
            shutil.rmtree(args.dir / mode)
        sync_info = trainer.save_state(CheckpointStore(args.dir / "a", keep_last=1), data)
        snapshot = trainer.start_save_state(CheckpointStore(args.dir / "b", keep_last=1), data)
        trainer.fit(data, 20)
        snapshot.wait()
        background_info = CheckpointStore(args.dir / "b", keep_last=1).latest()
        a, b = digest(sync_info.path), digest(background_info.path)
    results["same_state_steps"] = [sync_info.step, background_info.step]
    results["files_differing"] = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
    results["same_bytes"] = not results["files_differing"]
    results["stall_ratio"] = results["background"]["stall_s"] / results["sync"]["stall_s"]
    print(f"background stall {results['background']['stall_s']:.2f} s against sync "
          f"{results['sync']['stall_s']:.2f} s: {results['stall_ratio']:.3f}x; one state "
          f"checkpointed both ways byte-identical: {results['same_bytes']} "
          f"({len(a)} files, differing: {results['files_differing'][:8]})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoint_stall.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
