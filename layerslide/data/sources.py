"""Token batches for causal-LM training: synthetic random tokens, or the examples of local data
files (read by files.py, rendered and tokenised by formats.py), shuffled each epoch
and packed into windows or one to a padded row."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from layerslide.data.files import read_tables
from layerslide.data.formats import (
    CHAT_FORMATS,
    DATA_FORMATS,
    Encoder,
    detect_format,
    tokenize_tables,
)
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX

if TYPE_CHECKING:
    from layerslide.data.formats import Corpus

_TOKENIZER_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError, RuntimeError)
_MASK64 = (1 << 64) - 1


# what each format trains on, as messages say it
_TRAINED_ON = {"messages": "the 'assistant' turns", "alpaca": "the 'output'",
               "prompt_completion": "the completion"}

# what messages call a source's examples
DATA, EVAL_DATA, HELD_OUT = "data", "eval data", "held-out eval part"


@runtime_checkable
class TokenSource(Protocol):
    """An endless stream of (input_ids, labels) batches that can be checkpointed and resumed;
    packed rows with document masks come as (input_ids, labels, position_ids), where each
    document's positions count from 0 and attention stays inside a document (the runner makes
    the mask from where positions restart)."""

    @property
    def vocab_size(self) -> int: ...

    def next_batch(self, micro_batch: int) -> tuple[torch.Tensor, ...]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    """Return value if it is an int >= minimum, else raise a ValueError that says so."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        msg = f"{name} must be an integer >= {minimum}, got {value!r}; set {name} to {minimum}+"
        raise ValueError(msg)
    return value


def _split_windows(windows: list[list[int]] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn [batch, seq_len + 1] windows into contiguous int64 (input_ids, labels)."""
    tokens = torch.as_tensor(windows, dtype=torch.int64)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _check_state(state: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise if a checkpoint's state was made by a different source or data."""
    for key, want in expected.items():
        if state.get(key) != want:
            msg = (f"checkpoint data state has {key}={state.get(key)!r} but this run has {want!r}; "
                   "resume with the same data, tokenizer and seq_len as the checkpointed run")
            raise ValueError(msg)


def _splitmix64(x: int) -> int:
    """Scramble a 64-bit integer (SplitMix64 finaliser) so nearby inputs give unrelated seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class SyntheticTokens:
    """Uniformly random tokens; window i depends only on (seed, i), so resume needs no RNG state."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0) -> None:
        self._vocab_size = _check_int("vocab_size", vocab_size)
        self.seq_len = _check_int("seq_len", seq_len)
        self.seed = _check_int("seed", seed, 0)
        self.epoch = 0  # the stream never ends, so it stays in its first epoch
        self.windows_done = 0
        self._generator = torch.Generator()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def next_batch(self, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next micro_batch windows as (input_ids, labels)."""
        _check_int("micro_batch", micro_batch)
        rows = []
        for index in range(self.windows_done, self.windows_done + micro_batch):
            self._generator.manual_seed(_splitmix64(_splitmix64(self.seed) ^ index))
            size = (self.seq_len + 1,)
            rows.append(torch.randint(self._vocab_size, size, generator=self._generator))
        self.windows_done += micro_batch
        return _split_windows(torch.stack(rows))

    def state_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable stream position."""
        return {"kind": "synthetic", "vocab_size": self._vocab_size, "seq_len": self.seq_len,
                "seed": self.seed, "windows_done": self.windows_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position returned by state_dict()."""
        _check_state(state, {"kind": "synthetic", "vocab_size": self._vocab_size,
                             "seq_len": self.seq_len, "seed": self.seed})
        self.windows_done = int(state["windows_done"])


def _load_tokenizer(tokenizer_dir: str | Path | None) -> Any:
    """Load a local Hugging Face tokenizer, raising a ValueError that says what to fix."""
    if tokenizer_dir is None:
        msg = "text data needs a tokenizer; pass tokenizer_dir (the model folder with tokenizer.json)"
        raise ValueError(msg)
    from transformers import AutoTokenizer  # only text data needs transformers

    if not Path(tokenizer_dir).is_dir():
        msg = f"tokenizer folder {tokenizer_dir} does not exist; pass the model's folder"
        raise ValueError(msg)
    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except _TOKENIZER_LOAD_ERRORS as err:
        msg = (f"cannot load a tokenizer from {tokenizer_dir} ({type(err).__name__}: {err}); "
               "pass a folder with tokenizer.json / tokenizer_config.json")
        raise ValueError(msg) from err


class DatasetTokens:
    """The examples of a tokenised corpus in a new order each epoch (a permutation drawn from
    (seed, epoch)), as rows of seq_len + 1 tokens; input_ids are a row's first seq_len tokens
    and labels[t] is token t + 1, or IGNORE_INDEX where that token is not trained on.

    Packed: an epoch's examples are concatenated and cut into windows that overlap by one token,
    so every token but the first is a label once an epoch (the last partial window is dropped);
    with document_mask each example's part of a window gets positions from 0 and attends only
    to itself (next_batch adds position_ids), and an example's first token is no label (the
    token before it, another example's last, cannot see it: as Hugging Face's
    DataCollatorWithFlattening); without it attention crosses example boundaries. Unpacked: one example a row, truncated
    to seq_len + 1 tokens and padded at the end (labels IGNORE_INDEX), so that causal attention
    never lets a real token see a pad. Examples with no trained label are skipped."""

    def __init__(self, corpus: Corpus, *, vocab_size: int, seq_len: int, seed: int, packing: bool,
                 pad_id: int | None, data_format: str, train_on_prompt: bool,
                 files: list[str], document_mask: bool = True,
                 examples: torch.Tensor | None = None, role: str = DATA) -> None:
        self.seq_len, self.seed, self.packing = seq_len, seed, packing
        self.document_mask = packing and document_mask
        self.format, self.train_on_prompt, self.files = data_format, train_on_prompt, files
        self._role = role  # what messages call it: the data, eval data, a held-out part
        self._vocab_size, self._corpus, self._pad_id = vocab_size, corpus, pad_id
        row = seq_len + 1
        lengths = corpus.lengths
        # what makes an example trainable: a label, where its first token is none
        labelled = (corpus.num_trained > 0 if packing and not self.document_mask
                    else corpus.first_label >= 1)
        if packing:
            kept = labelled
            self._lengths = lengths
        else:
            kept = labelled & (corpus.first_label < row)
            self._lengths = lengths.clamp(max=row)
        considered = torch.ones_like(kept)
        if examples is not None:  # this part of a split: only these examples
            considered = torch.zeros_like(kept)
            considered[examples] = True
            kept = kept & considered
        self._any_label = bool((labelled & considered).any())
        self._examples = kept.nonzero().flatten()
        self.num_examples = len(self._examples)
        self.num_skipped = (len(lengths) if examples is None else len(examples)) - (
            self.num_examples)
        self.num_tokens = int(self._lengths[self._examples].sum())
        truncated = self._examples[lengths[self._examples] > self._lengths[self._examples]]
        self.num_truncated = len(truncated)
        self.num_trained = self._count_trained(truncated)
        self.rows_per_epoch = (self.num_tokens - 1) // seq_len if packing else self.num_examples
        self._check_enough()
        self.max_token_id = max(int(corpus.ids.max()) if len(corpus.ids) else 0,
                                -1 if packing else pad_id)  # pads are inputs too
        self.epoch = self._row_index = 0
        self._order_epoch = -1  # the epoch whose order is loaded: none yet
        self._warn_of_dropped_tokens()

    def _count_trained(self, truncated: torch.Tensor) -> int:
        """The labels with loss an epoch has (packed: before the dropped partial window)."""
        trained = int(self._corpus.num_trained[self._examples].sum())
        if self.packing and not self.document_mask:
            return trained
        starts = self._corpus.starts
        trained -= int(self._corpus.trained[starts[self._examples]].sum())  # never a label
        if self.packing:
            return trained
        for example in truncated.tolist():
            trained -= int(self._corpus.trained[starts[example] + self.seq_len + 1:
                                                starts[example + 1]].sum())
        return trained

    def _check_enough(self) -> None:
        use = "train on" if self._role == DATA else "score"
        more = "a larger eval_fraction" if self._role == HELD_OUT else f"more {self._role}"
        of = "" if self._role == DATA else f" of the {self._role}"
        if not self._any_label and self._corpus.num_lost_turns:
            msg = (f"no example{of} has a token to {use}: the tokenizer's chat template renders "
                   f"each assistant turn ({self._corpus.num_lost_turns} in all) otherwise in the "
                   "whole conversation than after its prompt, so none can be found; mark the "
                   "assistant's turns in the template with {% generation %} ... "
                   "{% endgeneration %}, or pass train_on_prompt=True to train on every token")
            raise ValueError(msg)
        if not self._any_label:
            msg = (f"no example{of} has a token to {use} at all: {self.format} data is trained "
                   f"on {_TRAINED_ON.get(self.format, 'its text')}, and no example has any; "
                   "check the data's format and fields, or pass train_on_prompt=True to train "
                   "on every token")
            raise ValueError(msg)
        if self.packing and self.num_tokens < self.seq_len + 1:
            msg = (f"the {self._role} yields only {self.num_tokens} tokens to {use}, fewer than "
                   f"one window of seq_len + 1 = {self.seq_len + 1}; use a shorter seq_len or "
                   f"{more}")
            raise ValueError(msg)
        if not self.packing and self.num_examples == 0:
            msg = (f"no example{of} has a token to {use} within seq_len + 1 = {self.seq_len + 1} "
                   "tokens; check the data's format and fields, raise seq_len, or pass "
                   "train_on_prompt=True")
            raise ValueError(msg)
        if not self.packing and self._pad_id is None:
            msg = ("unpacked rows need a pad token and the tokenizer has neither a pad nor an "
                   "EOS token; pass packing=True or use a tokenizer with a pad token")
            raise ValueError(msg)

    def _warn_of_dropped_tokens(self) -> None:
        if self.num_truncated:
            warnings.warn(f"{self.num_truncated} of {self.num_examples} examples are longer than "
                          f"seq_len + 1 = {self.seq_len + 1} tokens and were truncated; raise "
                          "seq_len or pass packing=True to keep them whole", stacklevel=4)
        if self.num_skipped:
            warnings.warn(f"{self.num_skipped} examples have no token to train on "
                          f"{'' if self.packing else 'within seq_len + 1 tokens '}and are "
                          "skipped", stacklevel=4)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def describe(self) -> str:
        """One line on what the data is: format, examples, tokens, packing, what was dropped."""
        files = self.files[0] if len(self.files) == 1 else f"{len(self.files)} files"
        skipped = f" ({self.num_skipped} skipped: nothing to train on)" if self.num_skipped else ""
        masked = ", attention within each document" if self.document_mask else (
            ", attention across documents")
        rows = (f"packed into {self.rows_per_epoch} windows of {self.seq_len} tokens an epoch"
                f"{masked}" if self.packing else f"unpacked: one example a row, {self.num_truncated} "
                f"truncated to {self.seq_len + 1} tokens")
        return (f"{self.format} data from {files}: {self.num_examples} examples{skipped}, "
                f"{self.num_tokens} tokens, {self.num_trained} trained on; {rows}")

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The examples (corpus indices) in the order an epoch reads them."""
        generator = torch.Generator()
        generator.manual_seed(_splitmix64(_splitmix64(self.seed) ^ epoch))
        return self._examples[torch.randperm(self.num_examples, generator=generator)]

    def _next_row(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next row's seq_len + 1 tokens, their trained mask and their positions in their
        documents (from 0 where a row starts or cuts a document), wrapping to a new epoch."""
        if self._row_index == self.rows_per_epoch:
            self.epoch, self._row_index = self.epoch + 1, 0
        if self._order_epoch != self.epoch:
            self._order = self.epoch_order(self.epoch)
            self._ends = torch.cumsum(self._lengths[self._order], 0)  # each one's end in the stream
            self._order_epoch = self.epoch
        index, self._row_index = self._row_index, self._row_index + 1
        if self.packing:
            return self._window(index)
        return self._padded(int(self._order[index]))

    def _window(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [index * seq_len, index * seq_len + seq_len + 1) of the epoch's stream."""
        start = index * self.seq_len
        position = int(torch.searchsorted(self._ends, start, right=True))
        offset = start - (int(self._ends[position - 1]) if position else 0)
        ids, trained, positions, needed = [], [], [], self.seq_len + 1
        while needed:  # cannot run out: rows_per_epoch counted the stream's tokens
            example = int(self._order[position])
            begin = int(self._corpus.starts[example]) + offset
            end = min(begin + needed, int(self._corpus.starts[example + 1]))
            ids.append(self._corpus.ids[begin:end])
            trained.append(self._corpus.trained[begin:end])
            positions.append(torch.arange(end - begin))
            needed, position, offset = needed - (end - begin), position + 1, 0
        return torch.cat(ids), torch.cat(trained), torch.cat(positions)

    def _padded(self, example: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An example's first seq_len + 1 tokens, padded at the end; pads are not trained on."""
        begin, length = int(self._corpus.starts[example]), int(self._lengths[example])
        ids = torch.full((self.seq_len + 1,), self._pad_id, dtype=torch.int32)
        trained = torch.zeros(self.seq_len + 1, dtype=torch.bool)
        ids[:length] = self._corpus.ids[begin:begin + length]
        trained[:length] = self._corpus.trained[begin:begin + length]
        return ids, trained, torch.arange(self.seq_len + 1)

    def next_batch(self, micro_batch: int) -> tuple[torch.Tensor, ...]:
        """Return the next micro_batch rows as (input_ids, labels), with their position_ids
        after them where documents are masked."""
        _check_int("micro_batch", micro_batch)
        ids, trained, positions = (torch.stack(parts) for parts in
                                   zip(*(self._next_row() for _ in range(micro_batch)),
                                       strict=True))
        tokens = ids.to(torch.int64)
        if self.document_mask:  # a document's first token (position 0) is no label
            trained = trained & (positions > 0)
        labels = torch.where(trained[:, 1:], tokens[:, 1:], IGNORE_INDEX)
        batch = tokens[:, :-1].contiguous(), labels.contiguous()
        if self.document_mask:
            return *batch, positions[:, :-1].contiguous()
        return batch

    def _identity(self) -> dict[str, Any]:
        return {"kind": "dataset", "format": self.format, "packing": self.packing,
                "train_on_prompt": self.train_on_prompt, "seq_len": self.seq_len,
                "seed": self.seed, "num_examples": self.num_examples,
                "num_tokens": self.num_tokens, "num_trained": self.num_trained,
                "files": self.files}

    def state_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable stream position: the epoch and the row within it (the
        order of an epoch follows from the seed)."""
        return {**self._identity(), "epoch": self.epoch, "row_index": self._row_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position returned by state_dict() (or by a source from before a
        document's first token stopped being a label under document masks: the same data,
        its labels counted with those)."""
        expected = self._identity()
        before = int(self._corpus.num_trained[self._examples].sum())  # first tokens counted
        if self.document_mask and state.get("num_trained") == before:
            expected["num_trained"] = before
        _check_state(state, expected)
        self.epoch, self._row_index = int(state["epoch"]), int(state["row_index"])


def open_token_source(spec: str | Path | None, *, tokenizer_dir: str | Path | None,
                      vocab_size: int | None, seq_len: int, seed: int = 0,
                      data_format: str = "auto", text_field: str | None = None,
                      packing: bool | None = None, train_on_prompt: bool = False,
                      document_mask: bool = True, role: str = DATA) -> TokenSource:
    """Return synthetic tokens for None/"synthetic", else the examples of a data file or folder
    (see DatasetTokens), tokenised up front so that bad data fails here, before training.

    data_format: "auto" (from the records' fields) or one of formats.DATA_FORMATS; text_field:
    the field text records keep their text in (None: "text"; named, it is refused where the
    data has no such records); packing: None packs text and not chat-like data;
    train_on_prompt: train on prompts and templates too, not only on completions and replies;
    document_mask: packed examples attend only within themselves (False is refused where rows
    are not packed); role: what messages call the data (EVAL_DATA for eval data of its own,
    which the options are not judged by)."""
    if spec is None or spec == "synthetic":
        return SyntheticTokens(_check_int("vocab_size", vocab_size), seq_len, seed)
    return _open_dataset(spec, tokenizer_dir=tokenizer_dir, vocab_size=vocab_size,
                         seq_len=seq_len, seed=seed, data_format=data_format,
                         text_field=text_field, packing=packing,
                         train_on_prompt=train_on_prompt, document_mask=document_mask,
                         roles=(role,))[0]


def split_token_sources(spec: str | Path, *, eval_fraction: float, tokenizer_dir: str | Path | None,
                        vocab_size: int | None, seq_len: int, seed: int = 0,
                        **options: Any) -> tuple[DatasetTokens, DatasetTokens]:
    """The examples of a data file or folder split in two, tokenised once: (train, eval), the
    eval part `eval_fraction` of the examples drawn at random by `seed` (at least one, and at
    least one left to train on). options: those of open_token_source."""
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, int | float) or not (
            0 < eval_fraction < 1):
        msg = f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction!r}"
        raise ValueError(msg)
    return _open_dataset(spec, tokenizer_dir=tokenizer_dir, vocab_size=vocab_size,
                         seq_len=seq_len, seed=seed, eval_fraction=eval_fraction,
                         roles=(DATA, HELD_OUT), **options)


def _open_dataset(spec: str | Path, *, tokenizer_dir: str | Path | None, vocab_size: int | None,
                  seq_len: int, seed: int = 0, data_format: str = "auto",
                  text_field: str | None = None, packing: bool | None = None,
                  train_on_prompt: bool = False, document_mask: bool = True,
                  eval_fraction: float = 0.0,
                  roles: tuple[str, ...] = (DATA,)) -> tuple[DatasetTokens, ...]:
    """The dataset's source, or its (train, eval) sources where eval_fraction > 0."""
    _check_int("seq_len", seq_len)
    _check_int("seed", seed, 0)
    _check_choice("data_format", data_format, DATA_FORMATS)
    _check_choice("packing", packing, (None, True, False))
    _check_choice("train_on_prompt", train_on_prompt, (True, False))
    _check_choice("document_mask", document_mask, (True, False))
    field = "text" if text_field is None else text_field
    tables = read_tables(spec, field)
    tokenizer = _load_tokenizer(tokenizer_dir)
    formats = {table.name: detect_format(table, data_format, field) for table in tables}
    if len(set(formats.values())) > 1:
        msg = (f"the data files hold different formats ({formats}); train on one format at a "
               "time: put the others in another folder")
        raise ValueError(msg)
    found = next(iter(formats.values()))
    encoder = Encoder(tokenizer, found, field, train_on_prompt)
    named = packing is not None
    if packing is None:
        # text is long running prose, where padding would waste compute; chat-like examples are
        # short and stand alone: one a row keeps each reply's context its own conversation
        packing = found not in CHAT_FORMATS
    if DATA in roles:  # options are judged by the training data
        _refuse_idle_options(tables, found, text_field, document_mask, packing=packing,
                             packing_named=named)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if vocab_size is not None and pad_id is not None and pad_id >= vocab_size:
        # a pad added past the model's embedding: any id in it pads, since no real token
        # attends to a pad (they trail) and no pad is a label
        eos = tokenizer.eos_token_id
        pad_id = eos if eos is not None and eos < vocab_size else 0
    corpus = tokenize_tables(tables, encoder)
    parts: tuple[torch.Tensor | None, ...] = (None,)
    if eval_fraction:
        count = len(corpus.lengths)
        if count < 2:
            msg = (f"eval_fraction needs at least 2 examples to split, the data has {count}; "
                   "give eval data of its own")
            raise ValueError(msg)
        held = min(count - 1, max(1, round(eval_fraction * count)))
        generator = torch.Generator().manual_seed(_splitmix64(seed ^ 0x5EED_E7A1))
        order = torch.randperm(count, generator=generator)
        parts = (order[held:], order[:held])
    sources = tuple(DatasetTokens(corpus, vocab_size=len(tokenizer), seq_len=seq_len, seed=seed,
                                  packing=packing, pad_id=pad_id, data_format=found,
                                  train_on_prompt=train_on_prompt, files=list(formats),
                                  document_mask=document_mask, examples=part, role=role)
                    for part, role in zip(parts, roles, strict=True))
    if vocab_size is not None and sources[0].max_token_id >= vocab_size:
        msg = (f"the tokenizer at {tokenizer_dir} produces token id {sources[0].max_token_id} but "
               f"the model's vocab_size is {vocab_size}; use the model's own tokenizer")
        raise ValueError(msg)
    return sources


def _refuse_idle_options(tables: list[Any], found: str, text_field: str | None,
                         document_mask: bool, *, packing: bool, packing_named: bool) -> None:
    """Refuse a text_field or document_mask=False that would change nothing for this data."""
    if text_field is not None and found != "text":
        msg = (f"text_field {text_field!r} names the field text records keep their text in, "
               f"and the data holds {found} records, which are not read through it: drop "
               "text_field")
    elif text_field is not None and all(table.plain_text for table in tables):
        msg = (f"text_field {text_field!r} names the field of JSON text records, and the data "
               "is plain text (each paragraph a document), which has no fields: drop text_field")
    elif not document_mask and not packing:
        why = "packing=False" if packing_named else f"{found} data is not packed by default"
        msg = ("document_mask=False lets packed examples attend to each other, and these rows "
               f"are not packed ({why}): each row holds one example, which attends only to "
               "itself; drop document_mask=False, or pass packing=True to pack the examples")
    else:
        return
    raise ValueError(msg)


def eval_batches(source: DatasetTokens, micro_batch: int, max_rows: int) -> list[tuple]:
    """The first min(an epoch's rows, max_rows) rows of `source`, as micro-batches; the rows
    that fill the last micro-batch have no labels (not scored)."""
    _check_int("micro_batch", micro_batch)
    _check_int("max_rows", max_rows)
    rows = min(source.rows_per_epoch, max_rows)
    batches = []
    for start in range(0, rows, micro_batch):
        batch = source.next_batch(micro_batch)
        extra = start + micro_batch - rows
        if extra > 0:
            batch[1][-extra:] = IGNORE_INDEX
        batches.append(batch)
    return batches

def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise a ValueError naming the choices if value is not one of them (True is not 1)."""
    if not any(value is choice or (isinstance(value, str) and value == choice)
               for choice in choices):
        msg = f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        raise ValueError(msg)
