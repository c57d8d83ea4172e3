"""Records from local data files: JSON Lines, JSON, Parquet and Arrow read by the `datasets`
library (a file, a folder of them, or a folder written by `Dataset.save_to_disk`), and plain
text files whose blank-line-separated paragraphs are documents; `datasets`' cache for them
goes to a temporary folder, never beside the data. A name that is no path here and reads as a
Hugging Face Hub dataset (`name`, `owner/name`, either with `:split`) is loaded by `datasets`
through its own cache, from the Hub or offline (HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerslide.hub import cache_only_unless_the_hub_answers, dataset_name, unreachable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
TEXT_SUFFIX = ".txt"
DATA_SUFFIXES = (*BUILDERS, TEXT_SUFFIX)
_SUFFIX_LIST = ", ".join(DATA_SUFFIXES)
_OFFLINE = "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE"  # what puts datasets offline
_BATCH_RECORDS = 64  # records per batch: the tokenizer is much faster on batches
BOM = "\ufeff"  # the byte-order mark some editors write before UTF-8 text


@dataclass(frozen=True)
class RecordTable:
    """The records of one data file or saved dataset, each a dict of its fields."""

    path: Path
    columns: tuple[str, ...]
    batches: Callable[[], Iterator[list[dict[str, Any]]]]  # the records in order, in batches
    where: Callable[[int], str]  # record index -> where a user finds it ("line 3", "record 2")
    plain_text: bool = False
    hub_name: str | None = None  # a Hub dataset's `name:split`

    @property
    def name(self) -> str:
        """What the data's records are named by: a file's name, or a Hub dataset's."""
        return self.hub_name or self.path.name


def read_tables(spec: str | Path, text_field: str) -> list[RecordTable]:
    """Return the tables of a data file or folder, or of a Hub dataset's split, refusing
    paths that hold no usable data."""
    path = Path(spec).expanduser()
    hub = dataset_name(spec)
    if hub is not None:
        return [_hub_table(*hub)]
    if not path.exists():
        msg = (f"data path {path} does not exist; pass a data file ({_SUFFIX_LIST}), a folder "
               "of them, a folder saved by datasets' save_to_disk, a Hugging Face Hub dataset "
               "(name or name:split), or 'synthetic'")
        raise ValueError(msg)
    if path.is_dir():
        if any((path / name).is_file() for name in ("state.json", "dataset_dict.json")):
            return [_saved_dataset_table(path)]
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
        if not files:
            msg = (f"folder {path} has no {_SUFFIX_LIST} files and is not a saved dataset; "
                   "add some or pass a file instead")
            raise ValueError(msg)
    elif path.suffix not in DATA_SUFFIXES:
        msg = (f"data file {path} is not one of {_SUFFIX_LIST}; convert it, or rename a plain "
               "text file to .txt to train on its paragraphs")
        raise ValueError(msg)
    else:
        files = [path]
    return [_text_table(p, text_field) if p.suffix == TEXT_SUFFIX else _file_table(p)
            for p in files]


def _batches_of(path: Path, dataset: Any) -> Callable[[], Iterator[list[dict[str, Any]]]]:
    """Read a `datasets.Dataset` in batches of record dicts."""
    def batches() -> Iterator[list[dict[str, Any]]]:
        try:
            for columns in dataset.iter(batch_size=_BATCH_RECORDS):
                yield [dict(zip(columns, values, strict=True))
                       for values in zip(*columns.values(), strict=True)]
        except UnicodeDecodeError as err:  # Arrow keeps JSON strings' bytes unchecked till now
            if path.suffix in (".json", ".jsonl"):
                _raise_json_problem(path)
            msg = f"{path} holds text that is not valid UTF-8 ({err}); write it again as UTF-8"
            raise ValueError(msg) from err
    return batches


def _table_of(path: Path, dataset: Any, where: Callable[[int], str]) -> RecordTable:
    if dataset.num_rows == 0:
        msg = f"{path} holds no records; remove it from the data or add records to it"
        raise ValueError(msg)
    return RecordTable(path=path, columns=tuple(dataset.column_names),
                       batches=_batches_of(path, dataset), where=where)


def _file_table(path: Path) -> RecordTable:
    """Load one JSON Lines, JSON, Parquet or Arrow file into memory through `datasets`."""
    import datasets
    from datasets.exceptions import DatasetsError

    builder = BUILDERS[path.suffix]
    with _quiet_datasets(), tempfile.TemporaryDirectory(prefix="layerslide-data-") as cache:
        try:
            dataset = datasets.load_dataset(builder, data_files=[str(path)], split="train",
                                            cache_dir=cache, keep_in_memory=True)
        except (DatasetsError, ValueError, TypeError, OSError, StopIteration) as err:
            _raise_problem(path, builder)  # datasets' own message names neither line nor fix
            cause = err.__cause__ or err
            msg = (f"datasets cannot read {path} ({type(cause).__name__}: {cause}); check that "
                   f"it is a valid {builder} file whose records all have the same field types")
            raise ValueError(msg) from err
    return _table_of(path, dataset, _json_where(path) if builder == "json" else _row_where)


def _saved_dataset_table(path: Path) -> RecordTable:
    """Load a folder written by `Dataset.save_to_disk` (a DatasetDict's 'train' split)."""
    import datasets

    with _quiet_datasets():
        try:
            dataset = datasets.load_from_disk(str(path), keep_in_memory=True)
        except (ValueError, TypeError, OSError, KeyError) as err:
            msg = (f"datasets cannot load the saved dataset in {path} ({type(err).__name__}: "
                   f"{err}); save it again with Dataset.save_to_disk")
            raise ValueError(msg) from err
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            splits = sorted(dataset)
            msg = (f"{path} is a saved DatasetDict with splits {splits} and no 'train'; pass the "
                   f"folder of the split to train on, e.g. {path / splits[0]}")
            raise ValueError(msg)
        dataset = dataset["train"]
    return _table_of(path, dataset, _row_where)


def _hub_table(name: str, split: str | None) -> RecordTable:
    """A split of a Hub dataset (its 'train' where none is named), loaded by `datasets`
    through its own cache, its download's progress shown."""
    import datasets

    with _quiet_datasets(bars=True), cache_only_unless_the_hub_answers() as asked_offline:
        try:
            dataset = datasets.load_dataset(name, split=split)
        except datasets.exceptions.DatasetNotFoundError as err:
            msg = (f"data {name!r} is no path here, nor a dataset on the Hugging Face Hub "
                   f"({err}); check the name, or pass a data file or folder")
            raise ValueError(msg) from err
        except (ValueError, datasets.exceptions.DatasetsError) as err:  # a split it lacks, ...
            msg = (f"datasets cannot load Hub dataset {name!r}"
                   f"{f' split {split!r}' if split else ''} ({type(err).__name__}: {err}); name "
                   f"one of its splits as {name}:SPLIT, or save the part to train on with "
                   "save_to_disk and pass that folder")
            raise ValueError(msg) from err
        except (ConnectionError, FileNotFoundError) as err:  # not cached, and no Hub to ask
            msg = (f"data {name!r} is no path here, and as a Hugging Face Hub dataset it is not "
                   f"in datasets' cache ({datasets.config.HF_DATASETS_CACHE}), "
                   f"{unreachable('it', offline=asked_offline, switch=_OFFLINE)}")
            raise ValueError(msg) from err
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            splits = sorted(dataset)
            msg = (f"Hub dataset {name!r} has splits {splits} and no 'train'; name the one to "
                   f"train on, e.g. {name}:{splits[0]}")
            raise ValueError(msg)
        split, dataset = "train", dataset["train"]
    table = _table_of(Path(name), dataset, _row_where)
    return dataclasses.replace(table, hub_name=f"{name}:{split}")


def _row_where(index: int) -> str:
    return f"record {index} (counting from 0)"


@contextmanager
def _quiet_datasets(bars: bool = False) -> Iterator[None]:
    """Silence `datasets`' logs (and its progress bars, unless `bars`) while it reads,
    restoring them afterwards."""
    import datasets
    from datasets.utils import logging as datasets_logging

    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets_logging.get_verbosity()
    if not bars:
        datasets.disable_progress_bars()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


def _json_where(path: Path) -> Callable[[int], str]:
    """Name a record of a JSON file by its line: the index-th non-blank line in JSON Lines."""
    def where(index: int) -> str:
        with path.open("rb") as file:
            if file.read(4096).removeprefix(BOM.encode()).lstrip()[:1] == b"[":
                return f"record {index} (counting from 0)"
            file.seek(0)
            records = (n for n, raw in enumerate(file, 1) if raw.strip())
            line = next((n for i, n in enumerate(records) if i == index), None)
            return f"record {index} (counting from 0)" if line is None else f"line {line}"
    return where


def _decode(path: Path, raw: bytes, line_number: int, byte_offset: int) -> str:
    """Decode bytes starting a line as UTF-8, naming file, line and byte offset if they are not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_number += raw[: err.start].count(b"\n")
        msg = (f"{path} line {line_number} (byte offset {byte_offset + err.start}) is not valid "
               "UTF-8; re-encode the file as UTF-8 (e.g. iconv -t UTF-8) or remove that line")
        raise ValueError(msg) from err


def _raise_problem(path: Path, builder: str) -> None:
    """Raise a ValueError that says what is wrong with a file datasets failed to read, if known."""
    if builder == "json":
        _raise_json_problem(path)
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_metadata(path).num_rows
        except (OSError, ValueError):  # not parquet at all: the caller's message says so
            return
        if rows == 0:  # datasets fails on those, naming no cause
            msg = f"{path} holds no records; remove it from the data or add records to it"
            raise ValueError(msg)


def _raise_json_problem(path: Path) -> None:
    """Raise a ValueError naming the first line of a JSON or JSON Lines file that is wrong."""
    text = _decode(path, path.read_bytes(), 1, 0).removeprefix(BOM)
    if not text.strip():
        msg = f"{path} holds no records; remove it from the data or add records to it"
        raise ValueError(msg)
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # "Extra data": a whole value, then more: JSON Lines
                msg = (f"{path} line {err.lineno} column {err.colno} is not valid JSON "
                       f"({err.msg}); fix it (the file must be one JSON array of objects, or "
                       "JSON Lines)")
                raise ValueError(msg) from err
        else:
            _check_objects(path, ((f"record {i} (counting from 0)", r)
                                  for i, r in enumerate(records)))
            return
    _check_objects(path, ((f"line {number}", _parse_line(path, number, line))
                          for number, line in enumerate(text.splitlines(), 1) if line.strip()))


def _parse_line(path: Path, line_number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        msg = f"{path} line {line_number} is not valid JSON ({err.msg}); fix or remove that line"
        raise ValueError(msg) from err


def _check_objects(path: Path, records: Iterator[tuple[str, Any]]) -> None:
    """Raise a ValueError naming the first (where, record) pair whose record is not an object,
    or saying that no record has a field."""
    fields = seen = False
    for where, record in records:
        if not isinstance(record, dict):
            kind = type(record).__name__
            msg = (f"{path} {where} is a JSON {kind}, not an object; each record must be an "
                   'object of fields, such as {"text": ...} or {"messages": [...]}: write it '
                   "as one")
            raise ValueError(msg)  # noqa: TRY004 (bad input: ValueError, house style)
        fields = fields or bool(record)
        seen = True
    if not seen:
        msg = f"{path} holds no records; remove it from the data or add records to it"
        raise ValueError(msg)
    if not fields:  # datasets reads no columns and says the split has no data
        msg = (f"{path} holds only empty records ({{}}); each record needs fields such as "
               '{"text": ...}')
        raise ValueError(msg)


def _text_table(path: Path, text_field: str) -> RecordTable:
    """A plain text file: each blank-line-separated paragraph is a record {text_field: text}."""
    starts = [line for line, _ in _paragraphs(path)]  # one pass up front: bad bytes fail now
    if not starts:
        msg = f"{path} holds no text; remove it from the data or add documents to it"
        raise ValueError(msg)

    def batches() -> Iterator[list[dict[str, Any]]]:
        batch = []
        for _, paragraph in _paragraphs(path):
            batch.append({text_field: paragraph})
            if len(batch) == _BATCH_RECORDS:
                yield batch
                batch = []
        if batch:
            yield batch

    return RecordTable(path=path, columns=(text_field,), batches=batches,
                       where=lambda index: f"line {starts[index]}", plain_text=True)


def _paragraphs(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (first line number, text) of each blank-line-separated paragraph of a text file."""
    paragraph: list[str] = []
    start = byte_offset = 0
    with path.open("rb") as file:
        for line_number, raw in enumerate(file, 1):  # line by line: memory is one paragraph
            line = _decode(path, raw, line_number, byte_offset)
            if line_number == 1:
                line = line.removeprefix(BOM)  # an editor's mark, not text to train on
            byte_offset += len(raw)
            if line.strip():
                start = start if paragraph else line_number
                paragraph.append(line)
            elif paragraph:
                yield start, "".join(paragraph).rstrip("\r\n")
                paragraph = []
    if paragraph:
        yield start, "".join(paragraph).rstrip("\r\n")
