"""What `layerslide train` reads from its flags, checked before any work: the device, the
data and eval data (tokenised, their warnings said in flags), the outputs, and options that
would change nothing where they were given."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from layerslide.cli.options import UsageError, flag_of, given_as
from layerslide.cli.outputs import writable_file, writable_folder
from layerslide.cli.step_logs import require_tensorboard
from layerslide.planner.model import ModelSpec

# the data module's keyword names, as this command's flags
_DATA_FLAGS = (("train_on_prompt=True", "--train-on-prompt"), ("packing=True", "--packing on"),
               ("packing=False", "--packing off"), ("data_format", "--data-format"),
               ("text_field", "--text-field"), ("tokenizer_dir", "--tokenizer"),
               ("seq_len", "--seq-len"), ("eval_fraction", "--eval-fraction"))


def _in_flags(message: str) -> str:
    for keyword, flag in _DATA_FLAGS:
        message = message.replace(keyword, flag)
    return message


# options that act only beside another: (dest, whether that other is there, the other's flags)
_ACTS_ONLY_WITH = (
    ("keep_checkpoints", lambda a: a.checkpoint_dir, "--checkpoint-dir"),
    ("checkpoint_sync", lambda a: a.checkpoint_dir, "--checkpoint-dir"),
    ("keep_saves", lambda a: a.save_every, "--save-every"),
    ("resume_fallback", lambda a: a.resume, "--resume"),
    ("eval_rows", lambda a: a.eval_data or a.eval_fraction is not None,
     "--eval-data or --eval-fraction"),
    ("overwrite", lambda a: a.out, "--out"),
)


# how records become tokens: nothing of it applies to random tokens
_DATA_READING = ("data_format", "text_field", "packing", "attend_across_documents",
                 "train_on_prompt", "tokenizer")


def refuse_options_that_would_not_act(args) -> None:
    """Refuse an option given (typed, or set in --config) where it would change nothing: one
    that acts only beside another given without it, or how to read data with random tokens."""
    given = getattr(args, "given", frozenset())
    for dest, present, needed in _ACTS_ONLY_WITH:
        if dest in given and not present(args):
            raise UsageError(f"{given_as(args, dest)} acts only with {needed}: give that too, or "
                             f"drop {flag_of(dest)}")
    reading = [given_as(args, dest) for dest in _DATA_READING if dest in given]
    if reading and args.data == "synthetic" and not args.eval_data:
        raise UsageError(f"{', '.join(reading)}: --data synthetic trains on random tokens, "
                         "which are not read or tokenised: give a data file, or drop them")


def check_eval_flags(args) -> None:
    if args.eval_data and args.eval_fraction is not None:
        raise UsageError("--eval-data and --eval-fraction both name eval data: give one")
    if args.eval_fraction is not None:
        if not 0 < args.eval_fraction < 1:
            raise UsageError(f"--eval-fraction {args.eval_fraction}: give a fraction between 0 "
                             "and 1, e.g. 0.05")
        if args.data == "synthetic":
            raise UsageError("--eval-fraction holds out part of --data: give a data file")
    if args.eval_every is not None and not (args.eval_data or args.eval_fraction):
        raise UsageError("--eval-every needs eval data: --eval-data FILE or --eval-fraction F")
    if args.eval_every is not None and args.eval_every < 1:
        raise UsageError(f"--eval-every {args.eval_every}: score at least every step (>= 1)")
    if args.eval_rows < 1:
        raise UsageError(f"--eval-rows {args.eval_rows}: score at least one row")


def data_sources(args, spec: ModelSpec, train, tokenizer):
    """The training data and the eval schedule (None without eval data), tokenised and
    checked before any weight is allocated."""
    from layerslide.executor.data import (
        EVAL_DATA,
        eval_batches,
        open_token_source,
        split_token_sources,
    )
    from layerslide.executor.trainer import EvalSchedule

    options = {"tokenizer_dir": tokenizer, "vocab_size": spec.vocab_size,
               "seq_len": train.seq_len, "seed": args.seed, "data_format": args.data_format,
               "text_field": args.text_field,
               "packing": {"auto": None, "on": True, "off": False}[args.packing],
               "train_on_prompt": args.train_on_prompt,
               "document_mask": not args.attend_across_documents}
    try:
        with warnings.catch_warnings(record=True) as said:  # the data's warnings, in flags
            warnings.simplefilter("always")
            if args.eval_fraction is not None:
                data, held_out = split_token_sources(args.data, eval_fraction=args.eval_fraction,
                                                     **options)
            else:
                data = open_token_source(None if args.data == "synthetic" else args.data,
                                         **options)
                held_out = (open_token_source(args.eval_data, role=EVAL_DATA, **options)
                            if args.eval_data else None)
            if held_out is not None:
                batches = eval_batches(held_out, train.micro_batch, args.eval_rows)
    except ValueError as err:
        raise UsageError(_in_flags(str(err))) from err
    for warning in said:
        print(f"warning: {_in_flags(str(warning.message))}", file=sys.stderr)
    for name, source in (("data", data), ("eval data", held_out)):
        if hasattr(source, "describe"):
            print(f"{name}: {source.describe()}", flush=True)
    if held_out is None:
        return data, None
    return data, EvalSchedule(batches=batches, every_steps=args.eval_every)


def check_outputs(args) -> None:
    """Every path the run writes, before anything is loaded or trained."""
    writable_folder("--out", args.out, overwrite=args.overwrite)
    writable_file("--trace-out", args.trace_out)
    writable_file("--log-jsonl", args.log_jsonl)
    writable_folder("--tensorboard", args.tensorboard)
    if args.tensorboard:
        require_tensorboard()
    writable_folder("--checkpoint-dir", args.checkpoint_dir)


def device_of(name: str | None, torch) -> str:
    """The device to train on: cuda when present; a name torch does not train on is refused."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except (RuntimeError, ValueError) as err:
        raise UsageError(f"--device {name}: not a device; use cuda, cuda:N or cpu") from err
    if kind not in ("cuda", "cpu"):
        raise UsageError(f"--device {name}: layerslide trains on cuda or cpu; use one of them")
    if kind == "cpu" and torch.device(name).index not in (None, 0):
        raise UsageError(f"--device {name}: the CPU has no devices to pick from; use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name} but torch sees no CUDA GPU: use --device cpu")
    return name


def refuse_config_file_of_weights(args, path: Path) -> None:
    """--model folder/config.json would start from random weights of its architecture and
    silently leave the folder's own weights (and tokenizer) behind."""
    if path.is_file() and any(path.parent.glob("*.safetensors")) and not args.random_init:
        raise UsageError(f"--model {args.model}: pass the folder {path.parent} to train its "
                         "weights (config.json alone starts from random weights: add "
                         "--random-init to mean that)")


def check_schedule_flags(args) -> None:
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: train at least one step")
    if args.warmup_steps >= args.steps:
        raise UsageError(f"--warmup-steps {args.warmup_steps} is not below --steps "
                         f"{args.steps}: the learning rate would never leave its warmup; "
                         "use fewer warmup steps")


def data_of(args, trains_real_weights: bool) -> str:
    """The --data to use: given, or synthetic tokens (said aloud) where no weights are at
    stake; a model folder's weights are never trained on random tokens by default."""
    if args.data is not None:
        if args.data == "synthetic":
            print("note: --data synthetic: training on random tokens", file=sys.stderr)
        return args.data
    if trains_real_weights:
        raise UsageError(f"--data is needed to train the weights in {args.model} (a .jsonl/.txt "
                         "file or folder); --data synthetic trains them on random tokens")
    print("note: no --data: training on random tokens (--data synthetic)", file=sys.stderr)
    return "synthetic"
