"""Token sources: reading data files, packing, EOS, shuffled epochs, resume, synthetic
determinism, and refused inputs (data formats and masking: test_data_formats.py)."""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerslide.data.sources import (
    EVAL_DATA,
    DatasetTokens,
    SyntheticTokens,
    TokenSource,
    eval_batches,
    open_token_source,
    split_token_sources,
)
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
EOS = "</s>"
EOS_ID = 1  # tok_dir's id of EOS


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level tokenizer with an EOS token (no BOS, no chat template), saved like a
    model folder's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", EOS, *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tok"
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, unk_token="[UNK]")
    fast.save_pretrained(path)
    return path


def reference_docs(tok_dir: Path, docs: list[str]) -> list[list[int]]:
    """Tokenise docs one by one, as a user would, each followed by EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    return [[*tok.encode(doc, add_special_tokens=False), tok.eos_token_id] for doc in docs]


def reference_stream(tok_dir: Path, docs: list[str], order: torch.Tensor) -> list[int]:
    """The tokens of docs (with EOS) end to end in an epoch's order."""
    tokenised = reference_docs(tok_dir, docs)
    return [token for index in order.tolist() for token in tokenised[index]]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def windows(source: TokenSource, count: int, micro_batch: int = 1) -> list[list[int]]:
    """Draw count windows (as seq_len inputs and the last label) checking the batch contract
    on the way: every token of text is trained on, so labels are the inputs shifted by one,
    except that under document masks a document's first token (position 0) is no label."""
    out = []
    for _ in range(count // micro_batch):
        x, y, *positions = source.next_batch(micro_batch)
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (micro_batch, source.seq_len)
        assert x.is_contiguous() and y.is_contiguous()
        shifted = y[:, :-1]
        if positions:  # document masks: a document starts after each EOS, with no label
            starts = positions[0][:, 1:] == 0
            assert torch.equal(starts, x[:, :-1] == EOS_ID)
            assert torch.equal(torch.where(starts, IGNORE_INDEX, x[:, 1:]), shifted)
            assert torch.equal(y[:, -1] == IGNORE_INDEX, x[:, -1] == EOS_ID)
        else:
            assert torch.equal(x[:, 1:], shifted)
        out += [[*row_x, row_y[-1]] for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True)]
    return out


def cut(stream: list[int], seq_len: int, count: int, documents: bool = True) -> list[list[int]]:
    """The first count windows of seq_len + 1 tokens, overlapping by one, of a token stream of
    documents that each end with EOS; with documents (masks), a last token that starts a
    document is no label (IGNORE_INDEX), as windows() gives it."""
    rows = [stream[k * seq_len : k * seq_len + seq_len + 1] for k in range(count)]
    if documents:
        rows = [[*row[:-1], IGNORE_INDEX if row[-2] == EOS_ID else row[-1]] for row in rows]
    return rows


def text_source(spec: Path | str, tok_dir: Path, seq_len: int, **kwargs) -> DatasetTokens:
    source = open_token_source(str(spec), tokenizer_dir=tok_dir, vocab_size=12, seq_len=seq_len,
                               **kwargs)
    assert isinstance(source, DatasetTokens)
    return source


DOCS = ["the cat sat on the mat", "a dog ran far away", "the dog sat", "cat", "away far ran"]


def test_jsonl_folder_packs_shuffled_docs_with_eos_across_files(tok_dir, tmp_path):
    write_jsonl(tmp_path / "b.jsonl", DOCS[3:])
    write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    (tmp_path / "notes.md").write_text("ignored: not a data file")
    source = text_source(tmp_path, tok_dir, seq_len=4)
    order = source.epoch_order(0)
    assert sorted(order.tolist()) == list(range(len(DOCS)))  # a.jsonl's docs first: sorted
    stream = reference_stream(tok_dir, DOCS, order)
    assert stream.count(1) == len(DOCS)
    assert isinstance(source, TokenSource)
    assert source.vocab_size == 12
    assert (source.format, source.packing, source.files) == ("text", True, ["a.jsonl", "b.jsonl"])
    # every token is trained on but each document's first, which is no label
    assert (source.num_tokens, source.num_trained) == (len(stream), len(stream) - len(DOCS))
    assert source.rows_per_epoch == (len(stream) - 1) // 4
    got = windows(source, source.rows_per_epoch // 2 * 2, micro_batch=2)
    assert got == cut(stream, 4, len(got))
    assert source.describe() == (f"text data from 2 files: 5 examples, {len(stream)} tokens, "
                                 f"{len(stream) - 5} trained on; packed into "
                                 f"{source.rows_per_epoch} windows of 4 tokens an epoch, "
                                 "attention within each document")


def test_packed_positions_restart_at_each_document(tok_dir, tmp_path):
    """Each document's part of a window counts its positions from 0 (a token after EOS, id 1,
    starts a document), so the runner's mask keeps attention inside documents."""
    source = text_source(write_jsonl(tmp_path / "d.jsonl", DOCS), tok_dir, seq_len=5)
    for _ in range(source.rows_per_epoch // 2):
        ids, _, positions = source.next_batch(2)
        for row_ids, row_positions in zip(ids.tolist(), positions.tolist(), strict=True):
            expected, position = [], 0
            for k, token in enumerate(row_ids):
                expected.append(position)
                position = 0 if token == 1 else position + 1
                assert k or expected == [0]
            assert row_positions == expected
    crossing = text_source(tmp_path / "d.jsonl", tok_dir, seq_len=5, document_mask=False)
    assert len(crossing.next_batch(2)) == 2
    assert crossing.describe().endswith("attention across documents")


def test_a_documents_first_token_is_no_label_as_hugging_faces_flattening_collator_has_it(
        tok_dir, tmp_path):
    """Under document masks a packed document's first token is not what the previous
    document's last token learns to predict: labels and positions are those of transformers'
    DataCollatorWithFlattening (whose labels are not yet shifted: ours are its from 1 on)."""
    from transformers import DataCollatorWithFlattening

    docs = reference_docs(tok_dir, DOCS)
    total = sum(map(len, docs))
    source = text_source(write_jsonl(tmp_path / "d.jsonl", DOCS), tok_dir, seq_len=total - 1)
    assert source.rows_per_epoch == 1  # one row holds the epoch's stream
    x, y, positions = source.next_batch(1)
    order = source.epoch_order(0).tolist()
    flat = DataCollatorWithFlattening(return_tensors="pt")(
        [{"input_ids": docs[i], "labels": docs[i]} for i in order])
    assert x[0].tolist() == flat["input_ids"][0, :-1].tolist()
    assert y[0].tolist() == flat["labels"][0, 1:].tolist()
    assert positions[0].tolist() == flat["position_ids"][0, :-1].tolist()
    assert (y == IGNORE_INDEX).sum() == len(DOCS) - 1  # the documents after the first
    crossing = text_source(tmp_path / "d.jsonl", tok_dir, seq_len=total - 1,
                           document_mask=False)
    assert (crossing.next_batch(1)[1] == IGNORE_INDEX).sum() == 0  # attending across: labels


def test_plain_text_paragraphs_are_documents(tok_dir, tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("the cat\nsat on\n\n\nthe mat\n  \na dog ran\n")
    source = text_source(path, tok_dir, seq_len=3)
    paragraphs = ["the cat sat on", "the mat", "a dog ran"]
    stream = reference_stream(tok_dir, paragraphs, source.epoch_order(0))
    assert stream.count(1) == 3 and len(stream) == 12
    assert windows(source, source.rows_per_epoch) == cut(stream, 3, 3)


def test_each_epoch_reads_every_doc_once_in_a_new_order(tok_dir, tmp_path):
    docs = [" ".join(WORDS[i : i + 2]) for i in range(9)]
    source = text_source(write_jsonl(tmp_path / "d.jsonl", docs), tok_dir, seq_len=2)
    orders = [source.epoch_order(epoch).tolist() for epoch in range(3)]
    assert all(sorted(order) == list(range(9)) for order in orders)
    assert len({tuple(order) for order in orders}) == 3
    for epoch, order in enumerate(orders):
        expected = cut(reference_stream(tok_dir, docs, torch.tensor(order)), 2,
                       source.rows_per_epoch)
        assert windows(source, source.rows_per_epoch) == expected
        assert source.epoch == epoch  # until the next window is drawn
    windows(source, 1)
    assert source.epoch == 3


def test_seed_picks_the_order(tok_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [" ".join(WORDS[i : i + 3]) for i in range(8)])
    first = {seed: windows(text_source(path, tok_dir, 3, seed=seed), 8) for seed in (0, 5)}
    assert first[0] != first[5]
    assert windows(text_source(path, tok_dir, 3, seed=5), 8) == first[5]


def resumes_identically(make, draws_before: int, micro_batch: int) -> None:
    """A source restored from a JSON round-tripped state_dict yields what the original does."""
    original = make()
    windows(original, draws_before * micro_batch, micro_batch)
    state = json.loads(json.dumps(original.state_dict()))
    expected = windows(original, 12, micro_batch=2)
    resumed = make()
    resumed.load_state_dict(state)
    assert windows(resumed, 12, micro_batch=2) == expected
    assert resumed.state_dict() == original.state_dict()


@pytest.mark.parametrize("draws_before", [0, 1, 3, 7, 11, 40])  # 7 windows an epoch
def test_text_resume_continues_identically(tok_dir, tmp_path, draws_before):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:2])
    write_jsonl(tmp_path / "b.jsonl", DOCS[2:])
    assert text_source(tmp_path, tok_dir, 3).rows_per_epoch == 7
    resumes_identically(lambda: text_source(tmp_path, tok_dir, 3), draws_before, 1)


def test_resume_refuses_other_data_or_seed(tok_dir, tmp_path):
    state = text_source(write_jsonl(tmp_path / "a.jsonl", DOCS), tok_dir, 3).state_dict()
    other = text_source(write_jsonl(tmp_path / "a.jsonl", DOCS[:4]), tok_dir, 3)
    with pytest.raises(ValueError, match="num_examples.*same data"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="seed=0 but this run has 1"):
        text_source(tmp_path / "a.jsonl", tok_dir, 3, seed=1).load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="kind"):
        other.load_state_dict(SyntheticTokens(12, 3).state_dict())


def test_a_checkpoint_from_when_documents_first_tokens_were_labels_resumes(tok_dir, tmp_path):
    """Its data state counted each document's first token as trained: the same data."""
    source = text_source(write_jsonl(tmp_path / "a.jsonl", DOCS), tok_dir, 3)
    windows(source, 3)
    state = source.state_dict()
    resumed = text_source(tmp_path / "a.jsonl", tok_dir, 3)
    resumed.load_state_dict({**state, "num_trained": state["num_trained"] + len(DOCS)})
    assert windows(resumed, 4) == windows(source, 4)
    with pytest.raises(ValueError, match="num_trained=.* same data"):
        resumed.load_state_dict({**state, "num_trained": state["num_trained"] + 1})


def test_synthetic_is_deterministic_in_range_and_resumes():
    source = open_token_source(None, tokenizer_dir=None, vocab_size=7, seq_len=16, seed=3)
    assert isinstance(source, SyntheticTokens) and isinstance(source, TokenSource)
    assert source.vocab_size == 7
    batch = windows(source, 64, micro_batch=8)
    values = torch.tensor(batch)
    assert values.min() == 0 and values.max() == 6  # 1088 draws cover all 7 values
    same_seed = SyntheticTokens(7, 16, seed=3)
    assert windows(same_seed, 64, micro_batch=4) == batch  # independent of micro_batch too
    assert windows(SyntheticTokens(7, 16, seed=4), 8, micro_batch=8) != batch[:8]
    assert batch[0] != batch[1]
    resumes_identically(lambda: SyntheticTokens(7, 16, seed=3), 5, 3)
    with pytest.raises(ValueError, match="seed"):
        SyntheticTokens(7, 16, seed=9).load_state_dict(source.state_dict())


@settings(max_examples=25, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from([*WORDS, "zebra"]), max_size=6), min_size=1,
                  max_size=8),
    seq_len=st.integers(1, 9),
    seed=st.integers(0, 2**64 - 1),
)
@pytest.mark.filterwarnings("ignore:.*skipped")
def test_any_docs_pack_into_overlapping_windows(tok_dir, docs, seq_len, seed):
    texts = [" ".join(words) for words in docs]
    # under document masks a document's first token is no label: an empty one (EOS alone)
    # has none, and is skipped
    num_tokens = sum(len(doc) for doc in reference_docs(tok_dir, texts) if len(doc) > 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(Path(tmp) / "d.jsonl", texts)
        if num_tokens < seq_len + 1:
            words = f"only {num_tokens} tokens" if num_tokens else "no example has a token"
            with pytest.raises(ValueError, match=words):
                text_source(path, tok_dir, seq_len, seed=seed)
            return
        source = text_source(path, tok_dir, seq_len, seed=seed)
        got = windows(source, source.rows_per_epoch + 1)
    expected = [cut(reference_stream(tok_dir, texts, source.epoch_order(epoch)), seq_len,
                    source.rows_per_epoch) for epoch in (0, 1)]
    assert got == [*expected[0], expected[1][0]]


def records_file(tmp: Path, suffix: str, records: list[dict]) -> Path:
    """Write records as a .jsonl, .json (an array; JSON Lines if _lines.json), .parquet or
    .arrow file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / f"records{suffix}"
    if suffix in (".jsonl", "_lines.json"):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif suffix == ".json":
        path.write_text(json.dumps(records, indent=1))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(
                sink, pa.Table.from_pylist(records).schema) as writer:
            writer.write_table(pa.Table.from_pylist(records))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", "_lines.json", ".parquet", ".arrow"])
def test_reads_each_file_type_through_datasets_offline(tok_dir, tmp_path, suffix, monkeypatch):
    def no_network(*args):
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    path = records_file(tmp_path, suffix, [{"text": d, "n": i} for i, d in enumerate(DOCS)])
    source = text_source(path, tok_dir, seq_len=4)
    stream = reference_stream(tok_dir, DOCS, source.epoch_order(0))
    assert windows(source, 4) == cut(stream, 4, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no cache beside it


def test_reads_saved_datasets_and_folders_of_mixed_files(tok_dir, tmp_path):
    import datasets

    records = [{"text": d} for d in DOCS]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(records[:2]),
                          "test": datasets.Dataset.from_list(records)}
                         ).save_to_disk(str(tmp_path / "dict"))
    for folder, count in (("saved", 5), ("dict", 2)):
        source = text_source(tmp_path / folder, tok_dir, seq_len=2)
        assert (source.num_examples, source.files) == (count, [folder])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    records_file(mixed, ".parquet", records[:2])
    (mixed / "rest.txt").write_text("\n\n".join(DOCS[2:]))
    source = text_source(mixed, tok_dir, seq_len=2)
    assert (source.num_examples, source.files) == (5, ["records.parquet", "rest.txt"])
    stream = reference_stream(tok_dir, DOCS, source.epoch_order(0))
    assert windows(source, source.rows_per_epoch) == cut(stream, 2, source.rows_per_epoch)


def put(path: Path, data: bytes = b"") -> str:
    """Write data to path (making its folder) and return the path as a spec string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def docs_file(tmp: Path) -> str:
    return str(write_jsonl(tmp / "d.jsonl", DOCS))


def empty_parquet(tmp: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp / "e.parquet")
    return str(tmp / "e.parquet")


def saved_dict_without_train(tmp: Path) -> str:
    import datasets

    datasets.DatasetDict({"test": datasets.Dataset.from_list([{"text": "cat"}])}
                         ).save_to_disk(str(tmp / "dd"))
    return str(tmp / "dd")


# Each case: tmp folder -> open_token_source arguments; then the message.
BAD_INPUTS = {
    "missing path": (lambda t: {"spec": str(t / "nope.jsonl")}, r"nope\.jsonl does not exist"),
    "no data files": (lambda t: {"spec": str(Path(put(t / "x" / "a.md")).parent)},
                      r"x has no \.jsonl, \.json, \.parquet, \.arrow, \.txt files"),
    "other suffix": (lambda t: {"spec": put(t / "a.csv", b"text\ncat\n")},
                     r"a\.csv is not one of .*rename a plain text file to \.txt"),
    "empty file": (lambda t: {"spec": put(t / "empty.txt")}, r"empty\.txt holds no text"),
    "empty jsonl": (lambda t: {"spec": put(t / "empty.jsonl")}, r"empty\.jsonl holds no records"),
    "blank jsonl": (lambda t: {"spec": put(t / "blank.jsonl", b"\n \n")},
                    r"blank\.jsonl holds no records"),
    "empty parquet": (lambda t: {"spec": empty_parquet(t)}, r"e\.parquet holds no records"),
    "too few tokens": (lambda t: {"spec": put(t / "s.txt", b"cat")},
                       "only 2 tokens.*shorter seq_len or more data"),
    "non-utf8": (lambda t: {"spec": put(t / "u.jsonl", b'{"text": "cat"}\n{"text": "\xff"}')},
                 r"u\.jsonl line 2 \(byte offset 26\) is not valid UTF-8"),
    "non-utf8 text": (lambda t: {"spec": put(t / "u.txt", b"cat\n\ndog\xff\n")},
                      r"u\.txt line 3 \(byte offset 8\) is not valid UTF-8"),
    "bad json": (lambda t: {"spec": put(t / "j.jsonl", b'{"text": "cat"}\n\n{"text": \n')},
                 r"j\.jsonl line 3 is not valid JSON.*fix or remove that line"),
    "bad json array": (lambda t: {"spec": put(t / "j.json", b'[{"text": "cat"},\n{"text"}]')},
                       r"j\.json line 2 column 8 is not valid JSON"),
    "not an object": (lambda t: {"spec": put(t / "o.jsonl", b'{"text": "cat"}\n["cat"]\n')},
                      r"o\.jsonl line 2 is a JSON list, not an object"),
    "json lines of arrays": (lambda t: {"spec": put(t / "a.jsonl", b'["cat", "sat"]\n["dog", "ran"]\n')},
                             (r"a\.jsonl line 1 is a JSON list, not an object; each record must "
                              r"be an object of fields")),
    "empty records": (lambda t: {"spec": put(t / "e.jsonl", b'{}\n{}\n')},
                      r"e\.jsonl holds only empty records.*needs fields"),
    "empty array": (lambda t: {"spec": put(t / "a.json", b'[]')}, r"a\.json holds no records"),
    "no text field": (lambda t: {"spec": str(write_jsonl(t / "f.jsonl", DOCS, "body")),
                                 "data_format": "text"},
                      r"f\.jsonl line 1 has no string field 'text'.*text_field"),
    "no text in a record": (lambda t: {"spec": str(records_file(t, ".parquet", [
        {"text": "cat"}, {"text": None}]))},
        r"records\.parquet record 1 \(counting from 0\) has no string field 'text'"),
    "text not a string": (lambda t: {"spec": put(t / "n.jsonl", b'{"text": null}\n{"text": "a"}')},
                          r"n\.jsonl line 1 has no string field 'text'"),
    "saved without train": (lambda t: {"spec": saved_dict_without_train(t)},
                            r"splits \['test'\] and no 'train'; pass the folder of the split"),
    "no tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": None}, "tokenizer_dir"),
    "missing tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": t / "tk"},
                          r"tokenizer folder .*tk does not exist"),
    "broken tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": t},
                         "cannot load a tokenizer from"),
    "ids past vocab": (lambda t: {"spec": docs_file(t), "vocab_size": 8},
                       "token id 11 but the model's vocab_size is 8"),
    "text seq_len": (lambda t: {"spec": docs_file(t), "seq_len": 0}, "seq_len must be"),
    "text seed": (lambda t: {"spec": docs_file(t), "seed": -1}, "seed must be"),
    "bad format": (lambda t: {"spec": docs_file(t), "data_format": "chat"},
                   "data_format must be one of 'auto', 'text', 'messages'"),
    "bad packing": (lambda t: {"spec": docs_file(t), "packing": 1}, "packing must be one of"),
    "zero vocab": (lambda t: {"vocab_size": 0}, "vocab_size must be"),
    "no vocab": (lambda t: {"spec": "synthetic", "vocab_size": None}, "vocab_size must be"),
    "float seq_len": (lambda t: {"seq_len": 2.5}, "seq_len must be"),
    "negative seed": (lambda t: {"seed": -1}, "seed must be"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_refuses_bad_input_saying_what(tok_dir, tmp_path, case):
    setup, match = BAD_INPUTS[case]
    args = {"spec": None, "tokenizer_dir": tok_dir, "vocab_size": 12, "seq_len": 4}
    args |= setup(tmp_path)
    with pytest.raises(ValueError, match=match):
        open_token_source(args.pop("spec"), **args)


def test_refuses_bad_micro_batch(tok_dir, tmp_path):
    text = text_source(write_jsonl(tmp_path / "d.jsonl", DOCS), tok_dir, seq_len=4)
    for source in (text, SyntheticTokens(5, 4)):
        for bad in (0, -2, True, 1.0):
            with pytest.raises(ValueError, match="micro_batch must be an integer >= 1"):
                source.next_batch(bad)


def test_an_eval_fraction_holds_out_whole_examples_by_seed(tok_dir, tmp_path):
    docs = [" ".join(WORDS[i % 7:i % 7 + 3]) + f" {WORDS[i % 10]}" for i in range(20)]
    path = write_jsonl(tmp_path / "d.jsonl", docs)

    def split(seed):
        return split_token_sources(path, eval_fraction=0.25, tokenizer_dir=tok_dir,
                                   vocab_size=12, seq_len=4, seed=seed, packing=False)

    train, held = split(0)
    assert (train.num_examples, held.num_examples) == (15, 5)
    train_set, held_set = set(train.epoch_order(0).tolist()), set(held.epoch_order(0).tolist())
    assert not train_set & held_set and len(train_set | held_set) == 20
    assert set(split(0)[1].epoch_order(0).tolist()) == held_set
    assert set(split(7)[1].epoch_order(0).tolist()) != held_set
    batches = eval_batches(held, micro_batch=2, max_rows=5)
    assert len(batches) == 3
    assert (batches[-1][1][1] == IGNORE_INDEX).all() and (batches[-1][1][0] != IGNORE_INDEX).any()
    for fraction in (0, 1, True):
        with pytest.raises(ValueError, match="between 0 and 1"):
            split_token_sources(path, eval_fraction=fraction, tokenizer_dir=tok_dir,
                                vocab_size=12, seq_len=4)



def test_eval_data_too_small_is_named_as_eval_data_not_as_the_training_data(tok_dir, tmp_path):
    docs = [" ".join(WORDS[i % 7:i % 7 + 3]) for i in range(20)]
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    with pytest.raises(ValueError, match=r"the held-out eval part yields only \d+ tokens to "
                                         r"score.*use a shorter seq_len or a larger eval_fraction"):
        split_token_sources(path, eval_fraction=0.05, tokenizer_dir=tok_dir, vocab_size=12,
                            seq_len=16)
    with pytest.raises(ValueError, match=r"the eval data yields only \d+ tokens to score.*or "
                                         r"more eval data"):
        open_token_source(str(write_jsonl(tmp_path / "e.jsonl", docs[:1])), tokenizer_dir=tok_dir,
                          vocab_size=12, seq_len=16, role=EVAL_DATA)
