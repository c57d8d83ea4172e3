"""Training data as token batches: files and saved datasets read (`files`), their records
rendered and tokenized by format (`formats`: text, chat messages, alpaca, prompt/completion),
and the sources a run draws its micro-batches from, in one deterministic, resumable order
(`sources`)."""

from layerslide.data.sources import (
    DatasetTokens,
    SyntheticTokens,
    TokenSource,
    eval_batches,
    open_token_source,
    split_token_sources,
)

__all__ = ["DatasetTokens", "SyntheticTokens", "TokenSource", "eval_batches",
           "open_token_source", "split_token_sources"]
