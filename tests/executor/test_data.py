"""Token sources: packing, EOS, epochs, resume, synthetic determinism, and refused inputs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerslide.executor.data import SyntheticTokens, TextTokens, TokenSource, open_token_source

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
EOS = "</s>"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level tokenizer with an EOS token, saved like a model folder's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", EOS, *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tok"
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, unk_token="[UNK]")
    fast.save_pretrained(path)
    return path


def reference_stream(tok_dir: Path, docs: list[str]) -> list[int]:
    """Tokenise docs one by one, as a user would, each followed by EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    stream = []
    for doc in docs:
        stream += [*tok.encode(doc, add_special_tokens=False), tok.eos_token_id]
    return stream


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def windows(source: TokenSource, count: int, micro_batch: int = 1) -> list[list[int]]:
    """Draw count windows (as seq_len + 1 token lists) checking the batch contract on the way."""
    out = []
    for _ in range(count // micro_batch):
        x, y = source.next_batch(micro_batch)
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (micro_batch, source.seq_len)
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x[:, 1:], y[:, :-1])  # labels are the inputs shifted by one
        out += [[*row_x, row_y[-1]] for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True)]
    return out


DOCS = ["the cat sat on the mat", "a dog ran far away", "the dog sat", "cat", "away far ran"]


def test_jsonl_folder_packs_docs_with_eos_across_files(tok_dir, tmp_path):
    write_jsonl(tmp_path / "b.jsonl", DOCS[3:])
    write_jsonl(tmp_path / "a.jsonl", DOCS[:3])
    (tmp_path / "notes.md").write_text("ignored: not .jsonl/.txt")
    source = open_token_source(str(tmp_path), tokenizer_dir=tok_dir, vocab_size=12, seq_len=4)
    stream = reference_stream(tok_dir, DOCS)  # a.jsonl first: files are sorted
    assert stream.count(1) == len(DOCS)
    assert isinstance(source, TextTokens) and isinstance(source, TokenSource)
    assert source.vocab_size == 12
    assert source.num_tokens == len(stream)
    assert source.num_windows == (len(stream) - 1) // 4
    got = windows(source, source.num_windows // 2 * 2, micro_batch=2)
    assert got == [stream[k * 4 : k * 4 + 5] for k in range(len(got))]


def test_plain_text_paragraphs_are_documents(tok_dir, tmp_path):
    path = tmp_path / "book.text"
    path.write_text("the cat\nsat on\n\n\nthe mat\n  \na dog ran\n")
    source = TextTokens([path], tok_dir, seq_len=3)
    stream = reference_stream(tok_dir, ["the cat sat on", "the mat", "a dog ran"])
    assert stream[4] == stream[7] == stream[11] == 1
    assert windows(source, source.num_windows) == [stream[k * 3 : k * 3 + 4] for k in range(3)]


def test_wraps_around_and_counts_epochs(tok_dir, tmp_path):
    source = TextTokens([write_jsonl(tmp_path / "d.jsonl", DOCS)], tok_dir, seq_len=5)
    first_epoch = windows(source, source.num_windows)
    assert source.epoch == 0
    assert windows(source, source.num_windows) == first_epoch
    assert source.epoch == 1
    windows(source, 1)
    assert source.epoch == 2


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


@pytest.mark.parametrize("draws_before", [0, 1, 3, 7, 11])
def test_text_resume_continues_identically(tok_dir, tmp_path, draws_before):
    write_jsonl(tmp_path / "a.jsonl", DOCS[:2])
    write_jsonl(tmp_path / "b.jsonl", DOCS[2:])
    paths = sorted(tmp_path.glob("*.jsonl"))
    resumes_identically(lambda: TextTokens(paths, tok_dir, seq_len=3), draws_before, 1)


def test_resume_refuses_other_data(tok_dir, tmp_path):
    state = TextTokens([write_jsonl(tmp_path / "a.jsonl", DOCS)], tok_dir, 3).state_dict()
    other = TextTokens([write_jsonl(tmp_path / "a.jsonl", DOCS[:4])], tok_dir, 3)
    with pytest.raises(ValueError, match="num_tokens.*same data"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="kind"):
        other.load_state_dict(SyntheticTokens(12, 3).state_dict())


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
)
def test_any_docs_pack_into_overlapping_windows(tok_dir, docs, seq_len):
    texts = [" ".join(words) for words in docs]
    stream = reference_stream(tok_dir, texts)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(Path(tmp) / "d.jsonl", texts)
        if len(stream) < seq_len + 1:
            with pytest.raises(ValueError, match=f"only {len(stream)} tokens"):
                TextTokens([path], tok_dir, seq_len)
            return
        source = TextTokens([path], tok_dir, seq_len)
        got = windows(source, source.num_windows + 1)
    expected = [stream[k * seq_len : k * seq_len + seq_len + 1] for k in range(len(got) - 1)]
    assert got == [*expected, expected[0]]


def put(path: Path, data: bytes = b"") -> str:
    """Write data to path (making its folder) and return the path as a spec string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def docs_file(tmp: Path) -> str:
    return str(write_jsonl(tmp / "d.jsonl", DOCS))


# Each case: tmp folder -> open_token_source arguments; then the message.
BAD_INPUTS = {
    "missing path": (lambda t: {"spec": str(t / "nope.jsonl")}, r"nope\.jsonl does not exist"),
    "no data files": (lambda t: {"spec": str(Path(put(t / "x" / "a.md")).parent)},
                      r"x has no \.jsonl or \.txt files"),
    "empty file": (lambda t: {"spec": put(t / "empty.txt")}, r"empty\.txt holds no text"),
    "blank jsonl": (lambda t: {"spec": put(t / "blank.jsonl", b"\n \n")},
                    r"blank\.jsonl holds no text"),
    "too few tokens": (lambda t: {"spec": put(t / "s.txt", b"cat")},
                       "only 2 tokens.*shorter seq_len or more data"),
    "non-utf8": (lambda t: {"spec": put(t / "u.jsonl", b'{"text": "cat"}\n{"text": "\xff"}')},
                 r"u\.jsonl line 2 \(byte offset 26\) is not valid UTF-8"),
    "bad json": (lambda t: {"spec": put(t / "j.jsonl", b'{"text": "cat"}\n{"text": \n')},
                 r"j\.jsonl line 2 is not valid JSON"),
    "no text field": (lambda t: {"spec": str(write_jsonl(t / "f.jsonl", DOCS, "body"))},
                      r"f\.jsonl line 1 has no string field 'text'.*text_field"),
    "no tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": None}, "tokenizer_dir"),
    "missing tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": t / "tk"},
                          r"tokenizer folder .*tk does not exist"),
    "broken tokenizer": (lambda t: {"spec": docs_file(t), "tokenizer_dir": t},
                         "cannot load a tokenizer from"),
    "ids past vocab": (lambda t: {"spec": docs_file(t), "vocab_size": 8},
                       "token id 11 but the model's vocab_size is 8"),
    "text seq_len": (lambda t: {"spec": docs_file(t), "seq_len": 0}, "seq_len must be"),
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
    text = TextTokens([write_jsonl(tmp_path / "d.jsonl", DOCS)], tok_dir, seq_len=4)
    for source in (text, SyntheticTokens(5, 4)):
        for bad in (0, -2, True, 1.0):
            with pytest.raises(ValueError, match="micro_batch must be an integer >= 1"):
                source.next_batch(bad)
