"""tune --data: a step's tokens capped at the data's, so that no pick passes over a small data
set several times a step (train says so of any plan that does)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from layerslide import hub
from layerslide.cli.refusals import UsageError
from layerslide.planner import ModelSpec
from layerslide.tuner import SearchSpace


def data_capped(space: SearchSpace, args, model: ModelSpec) -> SearchSpace:
    """The space with max_tokens_per_step at most the data's rows an epoch times seq_len,
    said on stderr; where --max-tokens-per-step was given, that cap stands, with a warning if
    it lets a step take more than the data."""
    rows = data_rows(args, model)
    data_tokens = rows * args.seq_len
    cap = space.max_tokens_per_step
    if args.max_tokens_per_step is not None:  # the user's cap stands
        if cap is None or cap > data_tokens:
            print(f"tune: warning: the data has {rows} rows of {args.seq_len} tokens an epoch "
                  f"({data_tokens} tokens) and --max-tokens-per-step lets a step take more: "
                  "such a pick passes over the data more than once a step", file=sys.stderr)
        return space
    if cap is not None and cap <= data_tokens:
        return space
    print(f"tune: the data has {rows} rows of {args.seq_len} tokens an epoch: a step's tokens "
          f"(every rank's) capped at {data_tokens}, one pass over the data at most "
          "(--max-tokens-per-step N to choose)", file=sys.stderr)
    return replace(space, max_tokens_per_step=data_tokens)


def data_rows(args, model: ModelSpec) -> int:
    """The rows of seq_len tokens an epoch of --data gives, read as train reads it."""
    from layerslide.data.sources import open_token_source

    tokenizer = args.tokenizer or _model_folder(args.model)
    if tokenizer is None:
        raise UsageError(f"--data is counted in the model's tokens: give --model as a model "
                         f"folder or Hub id (owner/name), or --tokenizer DIR beside --model "
                         f"{args.model}; or drop --data and cap with --max-tokens-per-step N")
    try:
        source = open_token_source(args.data, tokenizer_dir=tokenizer,
                                   vocab_size=model.vocab_size, seq_len=args.seq_len)
    except (ValueError, OSError) as err:
        raise UsageError(f"--data {args.data}: {err}") from None
    return source.rows_per_epoch


def _model_folder(model: str) -> Path | None:
    """The folder of --model's tokenizer: the model's own folder, or a Hub id's snapshot."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        return folder
    if hub.is_model_id(model):
        return hub.model_folder(model, hub.MODEL_FILES_BUT_WEIGHTS)
    return None
