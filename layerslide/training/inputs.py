"""A run's inputs, checked before any work: the device, the data and eval data (tokenised,
their warnings said in flags), the outputs, and options that would change nothing where they
were given."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from layerslide.outputs import writable_file, writable_folder
from layerslide.planner.model import ModelSpec
from layerslide.training.run import RunConfig, RunError, flag_of

# the data module's keyword names, as this command's flags
_DATA_FLAGS = (("train_on_prompt=True", "--train-on-prompt"), ("packing=True", "--packing on"),
               ("packing=False", "--packing off"), ("data_format", "--data-format"),
               ("text_field", "--text-field"), ("tokenizer_dir", "--tokenizer"),
               ("seq_len", "--seq-len"), ("eval_fraction", "--eval-fraction"),
               ("document_mask=False", "--attend-across-documents"))


def _in_flags(message: str) -> str:
    for keyword, flag in _DATA_FLAGS:
        message = message.replace(keyword, flag)
    return message


# options that act only beside another: (dest, whether that other is there, the other's flags)
_ACTS_ONLY_WITH = (
    ("keep_checkpoints", lambda c: c.checkpoint_dir, "--checkpoint-dir"),
    ("checkpoint_sync", lambda c: c.checkpoint_dir, "--checkpoint-dir"),
    ("keep_saves", lambda c: c.save_every, "--save-every"),
    ("resume_fallback", lambda c: c.resume, "--resume"),
    ("eval_rows", lambda c: c.eval_data or c.eval_fraction is not None,
     "--eval-data or --eval-fraction"),
    ("overwrite", lambda c: c.out, "--out"),
)


# how records become tokens: nothing of it applies to random tokens
_DATA_READING = ("data_format", "text_field", "packing", "attend_across_documents",
                 "train_on_prompt", "tokenizer")


def refuse_options_that_would_not_act(config: RunConfig) -> None:
    """Refuse an option given (typed, or set in --config) where it would change nothing: one
    that acts only beside another given without it, or how to read data with random tokens."""
    given = config.given
    for dest, present, needed in _ACTS_ONLY_WITH:
        if dest in given and not present(config):
            raise RunError(f"{config.flag(dest)} acts only with {needed}: give that too, or "
                             f"drop {flag_of(dest)}")
    if config.attend_across_documents and config.packing == "off":
        raise RunError(f"{config.flag('attend_across_documents')} lets packed examples attend "
                       f"to each other, and {config.flag('packing')} off puts one example a "
                       "row: drop one of them")
    reading = [config.flag(dest) for dest in _DATA_READING if dest in given]
    if reading and config.data == "synthetic" and not config.eval_data:
        raise RunError(f"{', '.join(reading)}: --data synthetic trains on random tokens, "
                         "which are not read or tokenised: give a data file, or drop them")


def check_eval_flags(config: RunConfig) -> None:
    if config.eval_data and config.eval_fraction is not None:
        raise RunError("--eval-data and --eval-fraction both name eval data: give one")
    if config.eval_fraction is not None:
        if not 0 < config.eval_fraction < 1:
            raise RunError(f"--eval-fraction {config.eval_fraction}: give a fraction between 0 "
                             "and 1, e.g. 0.05")
        if config.data == "synthetic":
            raise RunError("--eval-fraction holds out part of --data: give a data file")
    if config.eval_every is not None and not (config.eval_data or config.eval_fraction):
        raise RunError("--eval-every needs eval data: --eval-data FILE or --eval-fraction F")
    if config.eval_every is not None and config.eval_every < 1:
        raise RunError(f"--eval-every {config.eval_every}: score at least every step (>= 1)")
    if config.eval_rows < 1:
        raise RunError(f"--eval-rows {config.eval_rows}: score at least one row")


def data_sources(config: RunConfig, spec: ModelSpec, train, tokenizer):
    """The training data and the eval schedule (None without eval data), tokenised and
    checked before any weight is allocated."""
    from layerslide.data.sources import (
        EVAL_DATA,
        eval_batches,
        open_token_source,
        split_token_sources,
    )
    from layerslide.training.trainer import EvalSchedule

    options = {"tokenizer_dir": tokenizer, "vocab_size": spec.vocab_size,
               "seq_len": train.seq_len, "seed": config.seed, "data_format": config.data_format,
               # named only where given: the data refuses a field its records are not read by
               "text_field": config.text_field if "text_field" in config.given else None,
               "packing": {"auto": None, "on": True, "off": False}[config.packing],
               "train_on_prompt": config.train_on_prompt,
               "document_mask": not config.attend_across_documents}
    try:
        with warnings.catch_warnings(record=True) as said:  # the data's warnings, in flags
            warnings.simplefilter("always")
            if config.eval_fraction is not None:
                data, held_out = split_token_sources(config.data, eval_fraction=config.eval_fraction,
                                                     **options)
            else:
                data = open_token_source(None if config.data == "synthetic" else config.data,
                                         **options)
                held_out = (open_token_source(config.eval_data, role=EVAL_DATA, **options)
                            if config.eval_data else None)
            if held_out is not None:
                batches = eval_batches(held_out, train.micro_batch, config.eval_rows)
    except ValueError as err:
        _say_warnings(said)  # what the data said before it was refused can be its cause
        raise RunError(_in_flags(str(err))) from err
    _say_warnings(said)
    for name, source in (("data", data), ("eval data", held_out)):
        if hasattr(source, "describe"):
            print(f"{name}: {source.describe()}", flush=True)
    _say_passes_a_step(data, train)
    if held_out is None:
        return data, None
    return data, EvalSchedule(batches=batches, every_steps=config.eval_every)


def _say_passes_a_step(data, train) -> None:
    """A note where a step takes more rows than an epoch of the data has: each step then
    learns from the same examples more than once."""
    rows = getattr(data, "rows_per_epoch", None)
    per_step = train.micro_batch * train.grad_accum * train.ranks
    if rows and per_step > rows:
        print(f"note: a step takes {per_step} rows (micro-batch x grad-accum x ranks) and the "
              f"data has {rows} an epoch: each step passes over it {per_step / rows:.1f} times; "
              "a smaller --grad-accum or --micro-batch gives more optimizer steps per epoch "
              "(`layerslide tune --data` caps a step at the data)", flush=True)


def _say_warnings(said) -> None:
    for warning in said:
        print(f"warning: {_in_flags(str(warning.message))}", file=sys.stderr)


def check_outputs(config: RunConfig) -> None:
    """Every path the run writes, before anything is loaded or trained."""
    writable_folder("--out", config.out, overwrite=config.overwrite)
    writable_file("--trace-out", config.trace_out)
    writable_file("--log-jsonl", config.log_jsonl)
    writable_folder("--tensorboard", config.tensorboard)
    if config.tensorboard:
        require_tensorboard()
    writable_folder("--checkpoint-dir", config.checkpoint_dir)


def require_tensorboard() -> None:
    """Refuse --tensorboard before any work where the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as err:
        raise RunError("--tensorboard needs the tensorboard package: pip install tensorboard "
                       f"({err})") from err


def with_ranks(config: RunConfig, ranks) -> RunConfig:
    """The config with the ranks the launch made (executor.ranks.Ranks): a --gpus or --hosts
    given that says otherwise is refused naming both (the launch decides; a resumed run takes
    the launch's, not its checkpoint's)."""
    launched = {"gpus": (ranks.gpus, "rank(s) on each host", "--nproc-per-node"),
                "hosts": (ranks.hosts, "host(s)", "--nnodes")}
    for name, (count, what, launch_flag) in launched.items():
        given = config.option(name)
        if name not in config.given or given == count:
            continue
        if ranks.world == 1:
            raise RunError(f"{config.flag(name)} {given}, but this process runs alone, not "
                           f"under torchrun: {SEVERAL_HOSTS}")
        raise RunError(f"{config.flag(name)} {given}, but torchrun launched {count} {what} "
                       f"({launch_flag} {count}): drop {flag_of(name)} (the launch sets it) "
                       f"or launch with {launch_flag} {given}")
    return config.with_(gpus=ranks.gpus, hosts=ranks.hosts)


# how a run of several hosts starts (said where one is asked for without it)
SEVERAL_HOSTS = ("start `torchrun --nnodes M --node-rank I --rdzv-backend c10d --rdzv-endpoint "
                 "HOST:PORT --nproc-per-node N -m layerslide train ...` on each of the M hosts "
                 "(I = 0..M-1, HOST:PORT one address all reach); `layerslide train --gpus N` "
                 "launches N ranks on this host alone")


def check_gpu_count(ranks_per_host: int, torch) -> None:
    """One GPU per rank: refuse more ranks on this host than torch sees CUDA devices."""
    count = torch.cuda.device_count()
    if ranks_per_host > count:
        raise RunError(f"{ranks_per_host} ranks on this host need a GPU each, and torch sees "
                       f"{count} CUDA GPU(s) (CUDA_VISIBLE_DEVICES="
                       f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): launch at most "
                       f"{count}, make more visible, or train on --device cpu")


def rank_device(device: str, ranks, torch) -> str:
    """This rank's device: the GPU of its local rank (cuda:LOCAL_RANK) on a run of several
    ranks, else `device`."""
    if ranks.world == 1 or not device.startswith("cuda"):
        return device
    if device != "cuda":
        raise RunError(f"--device {device}: each rank of a run of several takes the GPU of "
                       "its local rank (cuda:LOCAL_RANK): give --device cuda, and choose the "
                       "GPUs with CUDA_VISIBLE_DEVICES")
    check_gpu_count(ranks.gpus, torch)
    return f"cuda:{ranks.local_rank}"


def device_of(name: str | None, torch) -> str:
    """The device to train on: cuda when present; a name torch does not train on is refused."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except (RuntimeError, ValueError) as err:
        raise RunError(f"--device {name}: not a device; use cuda, cuda:N or cpu") from err
    if kind not in ("cuda", "cpu"):
        raise RunError(f"--device {name}: layerslide trains on cuda or cpu; use one of them")
    if kind == "cpu" and torch.device(name).index not in (None, 0):
        raise RunError(f"--device {name}: the CPU has no devices to pick from; use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RunError(f"--device {name} but torch sees no CUDA GPU: use --device cpu")
    return name


def refuse_config_file_of_weights(config: RunConfig, path: Path) -> None:
    """--model folder/config.json would start from random weights of its architecture and
    silently leave the folder's own weights (and tokenizer) behind."""
    if path.is_file() and any(path.parent.glob("*.safetensors")) and not config.random_init:
        raise RunError(f"--model {config.model}: pass the folder {path.parent} to train its "
                         "weights (config.json alone starts from random weights: add "
                         "--random-init to mean that)")


def check_schedule_flags(config: RunConfig) -> None:
    if config.steps < 1:
        raise RunError(f"--steps {config.steps}: train at least one step")
    if config.warmup_steps >= config.steps:
        raise RunError(f"--warmup-steps {config.warmup_steps} is not below --steps "
                         f"{config.steps}: the learning rate would never leave its warmup; "
                         "use fewer warmup steps")


def data_of(config: RunConfig, trains_real_weights: bool) -> str:
    """The --data to use: given, or synthetic tokens (said aloud) where no weights are at
    stake; a model folder's weights are never trained on random tokens by default."""
    if config.data is not None:
        if config.data == "synthetic":
            print("note: --data synthetic: training on random tokens", file=sys.stderr)
        return config.data
    if trains_real_weights:
        raise RunError(f"--data is needed to train the weights in {config.model} (a .jsonl/.txt "
                         "file or folder); --data synthetic trains them on random tokens")
    print("note: no --data: training on random tokens (--data synthetic)", file=sys.stderr)
    return "synthetic"
