"""Token batches for causal-LM training: synthetic random tokens or packed, tokenised text files."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

DATA_SUFFIXES = (".jsonl", ".txt")
_TOKENIZE_BATCH_DOCS = 64  # documents per tokenizer call: batching is much faster, memory stays small
_TOKENIZER_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError, RuntimeError)
_MASK64 = (1 << 64) - 1


@runtime_checkable
class TokenSource(Protocol):
    """An endless stream of (input_ids, labels) batches that can be checkpointed and resumed."""

    @property
    def vocab_size(self) -> int: ...

    def next_batch(self, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]: ...

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


@dataclass(frozen=True, kw_only=True)
class _Doc:
    """One tokenised document (EOS included) and where its text starts in the data files."""

    file_index: int
    byte_offset: int
    line_number: int
    ids: list[int]


def _decode(path: Path, raw: bytes, line_number: int, byte_offset: int) -> str:
    """Decode one line as UTF-8, naming file, line and byte offset if it is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = (f"{path} line {line_number} (byte offset {byte_offset + err.start}) is not valid "
               "UTF-8; re-encode the file as UTF-8 (e.g. iconv -t UTF-8) or remove that line")
        raise ValueError(msg) from err


def _read_documents(path: Path, text_field: str, byte_offset: int, line_number: int,
                    ) -> Iterator[tuple[int, int, str]]:
    """Yield (byte offset, line number, text) of each document from a position in one file."""
    jsonl = path.suffix == ".jsonl"
    whole_file, found = byte_offset == 0, False
    paragraph: list[str] = []
    start = (byte_offset, line_number)
    with path.open("rb") as file:
        file.seek(byte_offset)
        for raw in file:  # line by line, so memory is bounded by the longest line/paragraph
            line = _decode(path, raw, line_number, byte_offset)
            if not line.strip():
                if paragraph:
                    yield *start, "".join(paragraph).rstrip("\r\n")
                    found, paragraph = True, []
            elif jsonl:
                yield byte_offset, line_number, _jsonl_text(path, line, line_number, text_field)
                found = True
            else:
                if not paragraph:
                    start = (byte_offset, line_number)
                paragraph.append(line)
            byte_offset += len(raw)
            line_number += 1
    if paragraph:
        yield *start, "".join(paragraph).rstrip("\r\n")
    elif whole_file and not found:
        msg = f"{path} holds no text; remove it from the data or add documents to it"
        raise ValueError(msg)


def _jsonl_text(path: Path, line: str, line_number: int, text_field: str) -> str:
    """Return the text field of one JSONL line, naming file and line if it is malformed."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        msg = f"{path} line {line_number} is not valid JSON ({err.msg}); fix or remove that line"
        raise ValueError(msg) from err
    text = record.get(text_field) if isinstance(record, dict) else None
    if isinstance(text, str):
        return text
    msg = (f"{path} line {line_number} has no string field {text_field!r}; add it, or pass "
           "the name of the field that holds the text as text_field")
    raise ValueError(msg)


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


class TextTokens:
    """Documents from .jsonl (one per line) or plain text (one per blank-line-separated
    paragraph), each followed by EOS if the tokenizer has one, concatenated and cut into windows
    of seq_len + 1 tokens that overlap by one, so each token but the first is a label once an epoch."""

    def __init__(self, paths: Sequence[str | Path], tokenizer_dir: str | Path | None,
                 seq_len: int, text_field: str = "text") -> None:
        self.seq_len = _check_int("seq_len", seq_len)
        self.paths = tuple(Path(p) for p in paths)
        if not self.paths:
            msg = "no data files given; pass at least one .jsonl or text file"
            raise ValueError(msg)
        for path in self.paths:
            if not path.is_file():
                msg = f"data file {path} does not exist; check the path"
                raise ValueError(msg)
        self.text_field = text_field
        self._tokenizer = _load_tokenizer(tokenizer_dir)
        eos = self._tokenizer.eos_token_id
        self._eos: list[int] = [] if eos is None else [eos]
        # One streaming pass up front so bad data fails before training, and to size an epoch.
        self.num_tokens = self.max_token_id = 0
        for doc in self._documents(0, 0, 1):
            self.num_tokens += len(doc.ids)
            self.max_token_id = max(self.max_token_id, *doc.ids, 0)
        if self.num_tokens < self.seq_len + 1:
            msg = (f"the data yields only {self.num_tokens} tokens, fewer than one window of "
                   f"seq_len + 1 = {self.seq_len + 1}; use a shorter seq_len or more data")
            raise ValueError(msg)
        self.num_windows = (self.num_tokens - 1) // self.seq_len  # windows per epoch
        self.epoch = 0
        self._seek(window_index=0, file_index=0, byte_offset=0, line_number=1, token_skip=0)

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def _documents(self, file_index: int, byte_offset: int, line_number: int) -> Iterator[_Doc]:
        """Yield tokenised documents from a position to the end of the last file."""
        for index in range(file_index, len(self.paths)):
            texts = _read_documents(self.paths[index], self.text_field, byte_offset, line_number)
            byte_offset, line_number = 0, 1
            for chunk in _chunked(texts):
                ids = self._tokenizer([t for _, _, t in chunk], add_special_tokens=False,
                                      verbose=False)["input_ids"]
                for (offset, line, _), doc_ids in zip(chunk, ids, strict=True):
                    yield _Doc(file_index=index, byte_offset=offset, line_number=line,
                               ids=[*doc_ids, *self._eos])

    def _seek(self, *, window_index: int, file_index: int, byte_offset: int, line_number: int,
              token_skip: int) -> None:
        """Restart reading so that the next window begins token_skip tokens into a document."""
        self._window_index = window_index
        self._stream = self._documents(file_index, byte_offset, line_number)
        first = next(self._stream)
        self._docs = deque([first])  # documents that own the tokens in _buffer
        self._skip = token_skip  # tokens of _docs[0] already behind the next window
        self._buffer = first.ids[token_skip:]

    def _next_window(self) -> list[int]:
        """Return the next seq_len + 1 tokens, wrapping to a new epoch after the last window."""
        if self._window_index == self.num_windows:
            self.epoch += 1
            self._seek(window_index=0, file_index=0, byte_offset=0, line_number=1, token_skip=0)
        while len(self._buffer) < self.seq_len + 1:
            doc = next(self._stream)  # cannot run out: num_windows counted the tokens
            self._docs.append(doc)
            self._buffer.extend(doc.ids)
        window = self._buffer[: self.seq_len + 1]
        del self._buffer[: self.seq_len]  # the window's last token starts the next window
        self._skip += self.seq_len
        while self._skip >= len(self._docs[0].ids):
            self._skip -= len(self._docs.popleft().ids)
        self._window_index += 1
        return window

    def next_batch(self, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next micro_batch windows as (input_ids, labels)."""
        _check_int("micro_batch", micro_batch)
        return _split_windows([self._next_window() for _ in range(micro_batch)])

    def _identity(self) -> dict[str, Any]:
        return {"kind": "text", "seq_len": self.seq_len, "num_tokens": self.num_tokens,
                "files": [p.name for p in self.paths]}

    def state_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable stream position: epoch, window, and the file position
        of the document the next window starts in, so resuming re-reads one document only."""
        head = self._docs[0]
        return {**self._identity(), "epoch": self.epoch, "window_index": self._window_index,
                "file_index": head.file_index, "byte_offset": head.byte_offset,
                "line_number": head.line_number, "token_skip": self._skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position returned by state_dict()."""
        _check_state(state, self._identity())
        self.epoch = int(state["epoch"])
        self._seek(**{k: int(state[k]) for k in ("window_index", "file_index", "byte_offset",
                                                 "line_number", "token_skip")})


def _chunked(items: Iterator[tuple[int, int, str]]) -> Iterator[list[tuple[int, int, str]]]:
    """Group items into lists of _TOKENIZE_BATCH_DOCS (the last may be shorter)."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == _TOKENIZE_BATCH_DOCS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def open_token_source(spec: str | Path | None, *, tokenizer_dir: str | Path | None,
                      vocab_size: int | None, seq_len: int, seed: int = 0) -> TokenSource:
    """Return synthetic tokens for None/"synthetic", else packed text from a file or folder."""
    if spec is None or spec == "synthetic":
        return SyntheticTokens(_check_int("vocab_size", vocab_size), seq_len, seed)
    path = Path(spec)
    if not path.exists():
        msg = f"data path {path} does not exist; pass a .jsonl/.txt file, a folder, or 'synthetic'"
        raise ValueError(msg)
    files = [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
        if not files:
            msg = f"folder {path} has no .jsonl or .txt files; add some or pass a file instead"
            raise ValueError(msg)
    source = TextTokens(files, tokenizer_dir, seq_len)
    if vocab_size is not None and source.max_token_id >= vocab_size:
        msg = (f"the tokenizer at {tokenizer_dir} produces token id {source.max_token_id} but the "
               f"model's vocab_size is {vocab_size}; use the model's own tokenizer")
        raise ValueError(msg)
    return source
