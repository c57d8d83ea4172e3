"""`layerslide export CHECKPOINT_DIR --out FOLDER [--step N]`: a training-state checkpoint's
model as a Hugging Face folder, with the tokenizer the run used and its options file: the way
to a model whose run's final save failed, was killed, or was never asked for (no --out)."""

from __future__ import annotations

from layerslide.cli.options import positive_int
from layerslide.cli.run_config import RESOLVED_NAME, write_resolved


def add_export_command(sub, units: str) -> None:
    help = ("write the model of a training-state checkpoint (a run's --checkpoint-dir) as a "
            "Hugging Face folder: bf16 safetensors, config.json and the run's tokenizer")
    p = sub.add_parser("export", help=help, description=help, epilog=units)
    p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR",
                   help="the folder a run's --checkpoint-dir named")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--step", type=positive_int, default=None, metavar="N",
                   help="the checkpoint of step N (default: the newest whose checksums hold)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_export)


def cmd_export(args) -> int:
    from layerslide.outputs import size
    from layerslide.training.export import export_checkpoint
    from layerslide.training.run import RunConfig

    done = export_checkpoint(args.checkpoint_dir, args.out, step=args.step,
                             overwrite=args.overwrite)
    recorded = done.checkpoint_meta.get("run", {}).get("args")
    if recorded is not None:  # the run's options, for a rerun with --config (this folder: --out)
        write_resolved(done.folder, RunConfig.from_options({**recorded, "out": str(done.folder)}))
    tokenizer = (f"the tokenizer of {done.tokenizer}" if done.tokenizer is not None
                 else f"no tokenizer ({done.no_tokenizer})")
    source = (str(done.checkpoint) if done.slices == 1
              else f"the slices of {done.slices} ranks in {done.checkpoint}")
    print(f"exported step {done.step} ({source}) to {done.folder}: "
          f"{size(done.weights_bytes)} of bf16 weights, config.json, {tokenizer}"
          + (f", {RESOLVED_NAME}" if recorded is not None else ""))
    return 0
