"""Data formats: how text, messages, sharegpt, alpaca and prompt/completion records render and
which labels they train, token by token; packing, truncation, skips, shuffling, resume and the
refusals of records and tokenizers that do not fit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerslide.data.sources import EVAL_DATA, DatasetTokens, open_token_source
from layerslide.kernels.linear_cross_entropy import IGNORE_INDEX

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
SPECIAL = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
           "<think>", "</think>"]
VOCAB = {w: i for i, w in enumerate(["[UNK]", *SPECIAL, *WORDS])}
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} <|end|> "
            "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")
# renders earlier assistant turns as 'far', as templates that drop old reasoning do
FORGETFUL = TEMPLATE.replace("{{ m.content }}", "{{ m.content if loop.last or m.role != "
                             "'assistant' else 'far' }}")
NO_SYSTEM = ("{% if messages[0].role == 'system' %}{{ raise_exception('no system turns') }}"
             "{% endif %}" + TEMPLATE)
# prompts the assistant with a marker no turn of its renders with
PROMPTING = TEMPLATE.replace("{% if add_generation_prompt %}<|assistant|> ",
                             "{% if add_generation_prompt %}<|assistant|> <think> ")
# as Qwen3's and DeepSeek-R1's: an assistant turn's reasoning (<think> ... </think>) is
# rendered only after the last user turn, so earlier turns render otherwise once one follows
THINKING = (
    "{{ bos_token }}{% set ns = namespace(last=-1) %}{% for m in messages %}"
    "{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set answer = m.content.split('</think>')[-1].strip() %}"
    "{% set thought = m.content.split('</think>')[0].split('<think>')[-1].strip() "
    "if '</think>' in m.content else '' %}<|assistant|> GENERATION"
    "{% else %}<|{{ m.role }}|> {{ m.content }} <|end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}")
THOUGHT = ("{% if loop.index0 > ns.last %}<think> {{ thought }} </think> {% endif %}"
           "{{ answer }} <|end|>")
# the same with {% generation %} markers around what the assistant says
THINKING_MARKED = THINKING.replace("GENERATION", "{% generation %}" + THOUGHT
                                   + "{% endgeneration %} ")
THINKING = THINKING.replace("GENERATION", THOUGHT + " ")


def save_tokenizer(path: Path, template: str | None, *, bos: bool, eos: bool, pad: bool) -> Path:
    """A word-level tokenizer whose role markers are special tokens, saved as a model's is."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in SPECIAL])
    roles = {"bos_token": "<s>" if bos else None, "eos_token": "</s>" if eos else None,
             "pad_token": "<pad>" if pad else None}
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                   **{k: v for k, v in roles.items() if v})
    fast.chat_template = template
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def toks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """chat: BOS, EOS, pad and TEMPLATE; plain: EOS only, no template; bare: no special roles;
    forgetful and no_system: chat tokenizers with awkward templates."""
    root = tmp_path_factory.mktemp("toks")
    full = {"bos": True, "eos": True, "pad": True}
    return {"chat": save_tokenizer(root / "chat", TEMPLATE, **full),
            "plain": save_tokenizer(root / "plain", None, bos=False, eos=True, pad=False),
            "bare": save_tokenizer(root / "bare", None, bos=False, eos=False, pad=False),
            "forgetful": save_tokenizer(root / "forgetful", FORGETFUL, **full),
            "thinking": save_tokenizer(root / "thinking", THINKING, **full),
            "prompting": save_tokenizer(root / "prompting", PROMPTING, **full),
            "thinking_marked": save_tokenizer(root / "thinking_marked", THINKING_MARKED, **full),
            "no_system": save_tokenizer(root / "no_system", NO_SYSTEM, **full)}


def ids(names: str) -> list[int]:
    """Token ids of space-separated vocabulary entries; '_' is IGNORE_INDEX."""
    return [IGNORE_INDEX if name == "_" else VOCAB[name] for name in names.split()]


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def write(path: Path, records: list[dict]) -> Path:
    """Write records as JSON Lines, a JSON array, Parquet or a saved dataset, by path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif path.suffix == ".json":
        path.write_text(json.dumps(records, indent=2))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        import datasets

        datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def source_of(path: Path, tok: Path, seq_len: int, **kwargs) -> DatasetTokens:
    source = open_token_source(str(path), tokenizer_dir=tok, vocab_size=len(VOCAB),
                               seq_len=seq_len, **kwargs)
    assert isinstance(source, DatasetTokens)
    return source


def epoch_rows(source: DatasetTokens) -> list[tuple[list[int], list[int]]]:
    """One epoch's (input_ids, labels) rows, checking the batch contract."""
    rows = []
    for _ in range(source.rows_per_epoch):
        x, y, *_ = source.next_batch(1)
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (1, source.seq_len)
        rows.append((x[0].tolist(), y[0].tolist()))
    return rows


def by_example(source: DatasetTokens, expected: list | dict[int, tuple[str, str]]) -> list:
    """Expected unpacked rows (inputs, labels) by example index, in the first epoch's order."""
    return [(ids(expected[i][0]), ids(expected[i][1])) for i in source.epoch_order(0).tolist()]


TWO_CHATS = [
    {"messages": [turn("user", "the cat"), turn("assistant", "a dog")]},
    {"messages": [turn("system", "sat"), turn("user", "dog"), turn("assistant", "cat sat"),
                  turn("user", "a"), turn("assistant", "the")]},
]
TWO_CHATS_ROWS = [  # seq_len 16: inputs, labels (the next token where it is an assistant's)
    ("<s>  <|user|> the cat <|end|> <|assistant|> a   dog   <|end|> <pad> " + "<pad> " * 6,
     "_    _        _   _   _       a             dog <|end|> _     _     " + "_ " * 6),
    ("<s> <|system|> sat <|end|> <|user|> dog <|end|> <|assistant|> cat sat     <|end|> "
     + "<|user|> a <|end|> <|assistant|> the",
     "_   _          _   _       _        _   _       cat           sat <|end|> _       "
     + "_        _ _       the           <|end|>"),
]


def test_messages_jsonl_train_only_assistant_turns_unpacked(toks, tmp_path):
    source = source_of(write(tmp_path / "chat.jsonl", TWO_CHATS), toks["chat"], seq_len=16)
    assert (source.format, source.packing) == ("messages", False)  # chat data: unpacked
    assert epoch_rows(source) == by_example(source, TWO_CHATS_ROWS)
    assert (source.num_examples, source.num_tokens, source.num_trained) == (2, 9 + 17, 3 + 5)
    assert source.describe() == ("messages data from chat.jsonl: 2 examples, 26 tokens, 8 "
                                 "trained on; unpacked: one example a row, 0 truncated to 17 "
                                 "tokens")


def test_sharegpt_saved_dataset(toks, tmp_path):
    records = [{"conversations": [{"from": "system", "value": "far"}, {"from": "human",
                                  "value": "the"}, {"from": "gpt", "value": "cat"}]}]
    source = source_of(write(tmp_path / "saved", records), toks["chat"], seq_len=10)
    assert epoch_rows(source) == [(
        ids("<s> <|system|> far <|end|> <|user|> the <|end|> <|assistant|> cat <|end|>"),
        ids("_   _          _   _       _        _   _       cat           <|end|> _"))]


ALPACA = [{"instruction": "the cat", "input": "sat on", "output": "a mat"},
          {"instruction": "dog", "output": "ran far"}]


def test_alpaca_json_array_with_a_chat_template(toks, tmp_path):
    source = source_of(write(tmp_path / "alpaca.json", ALPACA), toks["chat"], seq_len=10)
    assert source.format == "alpaca"
    assert epoch_rows(source) == by_example(source, [  # instruction, blank line, input: one turn
        ("<s> <|user|> the cat sat on <|end|> <|assistant|> a   mat",
         "_   _        _   _   _   _  _       a             mat <|end|>"),
        ("<s> <|user|> dog <|end|> <|assistant|> ran far     <|end|> <pad> <pad>",
         "_   _        _   _       ran           far <|end|> _       _     _"),
    ])


def test_alpaca_without_a_template_is_prompt_then_completion_then_eos(toks, tmp_path):
    source = source_of(write(tmp_path / "alpaca.json", ALPACA), toks["plain"], seq_len=7)
    assert epoch_rows(source) == by_example(source, [  # pads are EOS: the tokenizer has no pad
        ("the cat sat on a   mat  </s>", "_   _   _   a  mat </s> _"),
        ("dog ran far  </s> </s> </s> </s>", "ran far </s> _ _ _ _"),
    ])


def test_prompt_completion_parquet_strings_and_messages(toks, tmp_path):
    strings = [{"prompt": "the cat", "completion": " sat on"}]
    source = source_of(write(tmp_path / "pc.parquet", strings), toks["chat"], seq_len=5)
    assert source.format == "prompt_completion"
    assert epoch_rows(source) == [(ids("<s> the cat sat on"), ids("_ _ sat on </s>"))]
    conversational = [{"prompt": [turn("user", "a"), turn("assistant", "dog"), turn("user", "cat")],
                       "completion": [turn("assistant", "sat")]}]
    source = source_of(write(tmp_path / "conv.parquet", conversational), toks["chat"], seq_len=13)
    assert epoch_rows(source) == [(  # the prompt's own assistant turn is a shot, not trained
        ids("<s> <|user|> a <|end|> <|assistant|> dog <|end|> <|user|> cat <|end|> <|assistant|> "
            "sat <|end|>"),
        ids("_ _ _ _ _ _ _ _ _ _ sat <|end|> _"))]


def test_text_gets_bos_that_is_never_trained_and_packs_by_default(toks, tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("the cat\n\na dog sat\n")
    source = source_of(path, toks["chat"], seq_len=4)
    docs = [ids("<s> the cat </s>"), ids("<s> a dog sat </s>")]
    stream = [t for i in source.epoch_order(0).tolist() for t in docs[i]]
    assert (source.packing, source.rows_per_epoch, source.num_trained) == (True, 2, 7)
    expected = [(stream[k : k + 4], [IGNORE_INDEX if t == VOCAB["<s>"] else t
                                     for t in stream[k + 1 : k + 5]]) for k in (0, 4)]
    assert epoch_rows(source) == expected


def test_train_on_prompt_trains_every_token_bos_included(toks, tmp_path):
    source = source_of(write(tmp_path / "chat.jsonl", TWO_CHATS[:1]), toks["chat"], seq_len=9,
                       train_on_prompt=True)
    assert epoch_rows(source) == [(
        ids("<s>      <|user|> the cat     <|end|>       <|assistant|> a dog   <|end|>"),
        ids("<|user|> the      cat <|end|> <|assistant|> a             dog <|end|> _"))]
    path = tmp_path / "t.txt"
    path.write_text("the cat\n\nsat on")  # two documents: is the second's BOS a label?
    for train_on_prompt, document_mask, bos in ((True, False, "<s>"), (True, True, "_"),
                                                (False, False, "_")):
        source = source_of(path, toks["chat"], seq_len=7, train_on_prompt=train_on_prompt,
                           document_mask=document_mask)
        assert source.next_batch(1)[1][0].tolist()[3] == ids(bos)[0]


def test_packed_messages_mask_every_prompt_in_the_window(toks, tmp_path):
    source = source_of(write(tmp_path / "chat.jsonl", TWO_CHATS), toks["chat"], seq_len=5,
                       packing=True)
    chats = [ids(TWO_CHATS_ROWS[0][0])[:9], ids(TWO_CHATS_ROWS[1][0]) + ids("<|end|>")]
    trained = [[False] * 6 + [True] * 3, [False] * 8 + [True] * 3 + [False] * 4 + [True] * 2]
    order = source.epoch_order(0).tolist()
    stream = [t for i in order for t in chats[i]]
    flags = [f for i in order for f in trained[i]]
    assert source.rows_per_epoch == (26 - 1) // 5
    assert epoch_rows(source) == [
        (stream[k : k + 5], [t if f else IGNORE_INDEX for t, f in zip(stream[k + 1 : k + 6],
                                                                       flags[k + 1 : k + 6],
                                                                       strict=True)])
        for k in range(0, 25, 5)]


def test_unpacked_text_is_one_padded_document_a_row(toks, tmp_path):
    path = write(tmp_path / "t.jsonl", [{"text": "the cat sat"}, {"text": "dog"}])
    source = source_of(path, toks["chat"], seq_len=5, packing=False)
    assert epoch_rows(source) == by_example(source, [
        ("<s> the cat sat </s>", "the cat sat </s> _"),
        ("<s> dog  </s> <pad> <pad>", "dog </s> _     _     _"),
    ])


TRUNCATED_AND_SKIPPED = [
    *TWO_CHATS,  # 9 tokens, the first answer token 7th: truncated; 17, its 9th: skipped unpacked
    {"messages": [turn("user", "dog")]},  # no assistant turn: skipped packed or not
    {"messages": [turn("user", "a"), turn("assistant", "cat")]},  # 7 tokens: fits
]


def test_truncation_and_skips_are_counted_and_reported(toks, tmp_path):
    path = write(tmp_path / "chat.jsonl", TRUNCATED_AND_SKIPPED)
    with pytest.warns(UserWarning) as caught:
        source = source_of(path, toks["chat"], seq_len=6)
    assert [str(w.message) for w in caught] == [
        ("1 of 2 examples are longer than seq_len + 1 = 7 tokens and were truncated; raise "
         "seq_len or pass packing=True to keep them whole"),
        "2 examples have no token to train on within seq_len + 1 tokens and are skipped"]
    assert (source.num_examples, source.num_skipped, source.num_truncated) == (2, 2, 1)
    assert (source.num_tokens, source.num_trained) == (7 + 7, 1 + 2)
    assert source.describe() == (
        "messages data from chat.jsonl: 2 examples (2 skipped: nothing to train on), 14 tokens, "
        "3 trained on; unpacked: one example a row, 1 truncated to 7 tokens")
    assert epoch_rows(source) == by_example(source, {
        0: ("<s> <|user|> the cat <|end|> <|assistant|>", "_ _ _ _ _ a"),
        3: ("<s> <|user|> a <|end|> <|assistant|> cat", "_ _ _ _ cat <|end|>")})
    with pytest.warns(UserWarning, match="^1 examples have no token to train on and are"):
        packed = source_of(path, toks["chat"], seq_len=6, packing=True)
    assert (packed.num_examples, packed.num_truncated, packed.num_tokens) == (3, 0, 9 + 17 + 7)


def test_shuffles_examples_by_seed_once_each_an_epoch(toks, tmp_path):
    chats = [{"messages": [turn("user", WORDS[i]), turn("assistant", WORDS[(i + 3) % 10])]}
             for i in range(10)]
    path = write(tmp_path / "chat.jsonl", chats)
    source = source_of(path, toks["chat"], seq_len=7)
    epochs = [epoch_rows(source) for _ in range(2)]
    assert all(sorted(map(str, rows)) == sorted(map(str, epochs[0])) for rows in epochs)
    assert len({str(row) for row in epochs[0]}) == 10
    assert epochs[0] != epochs[1]
    assert epoch_rows(source_of(path, toks["chat"], seq_len=7)) == epochs[0]
    assert epoch_rows(source_of(path, toks["chat"], seq_len=7, seed=5)) != epochs[0]


def draw(source: DatasetTokens, count: int, micro_batch: int) -> list[list[list[int]]]:
    return [[t.tolist() for t in source.next_batch(micro_batch)] for _ in range(count)]


def resumes_identically(make, draws_before: int) -> None:
    """A source restored from a JSON round-tripped state_dict yields what the original does."""
    original = make()
    draw(original, draws_before, 1)
    state = json.loads(json.dumps(original.state_dict()))
    expected = draw(original, 6, 3)
    resumed = make()
    resumed.load_state_dict(state)
    assert draw(resumed, 6, 3) == expected
    assert resumed.state_dict() == original.state_dict()


CORPORA = {  # a file name and records for each format
    "text": ("t.jsonl", [{"text": " ".join(WORDS[i : i + 3])} for i in range(7)]),
    "messages": ("m.jsonl", [{"messages": [turn("user", w), turn("assistant", "cat dog")]}
                             for w in WORDS[:5]]),
    "sharegpt": ("saved", [{"conversations": [{"from": "human", "value": w},
                                              {"from": "gpt", "value": "cat dog"}]}
                           for w in WORDS[:5]]),
    "alpaca": ("a.json", [{"instruction": w, "output": "far"} for w in WORDS[:6]]),
    "prompt_completion": ("p.parquet", [{"prompt": w, "completion": " far away"}
                                        for w in WORDS[:6]]),
}


@pytest.mark.parametrize("corpus", CORPORA)
@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.filterwarnings("ignore:.*truncated")
def test_resumes_mid_epoch_and_across_epochs(toks, tmp_path, corpus, packing):
    name, records = CORPORA[corpus]
    path = write(tmp_path / name, records)
    def make() -> DatasetTokens:
        return source_of(path, toks["chat"], seq_len=6, packing=packing)

    rows = make().rows_per_epoch
    assert rows >= 4
    for draws_before in (rows // 2, rows, rows + 1, 2 * rows + 3):
        resumes_identically(make, draws_before)


def reference(messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """TEMPLATE's tokens for a conversation by hand, and which are an assistant's."""
    tokens, trained = ["<s>"], [False]
    for message in messages:
        words = message["content"].split()
        tokens += [f"<|{message['role']}|>", *words, "<|end|>"]
        trained += [False] + [message["role"] == "assistant"] * (len(words) + 1)
    return ids(" ".join(tokens)), trained


def expected_epoch(source: DatasetTokens, examples: list[tuple[list[int], list[bool]]],
                   epoch: int) -> list[tuple[list[int], list[int]]]:
    """An epoch's rows made from reference examples, as the DatasetTokens docstring says."""
    row = source.seq_len + 1
    order = source.epoch_order(epoch).tolist()
    if source.packing:
        tokens = [t for i in order for t in examples[i][0]]
        flags = [f for i in order for f in examples[i][1]]
        windows = [(tokens[k : k + row], flags[k : k + row])
                   for k in range(0, source.rows_per_epoch * source.seq_len, source.seq_len)]
    else:
        pad = [VOCAB["<pad>"]] * row
        windows = [((examples[i][0] + pad)[:row], (examples[i][1] + [False] * row)[:row])
                   for i in order]
    return [(w[:-1], [t if f else IGNORE_INDEX for t, f in zip(w[1:], m[1:], strict=True)])
            for w, m in windows]


words = st.lists(st.sampled_from(WORDS), max_size=3).map(" ".join)
conversations = st.tuples(
    st.builds(turn, st.sampled_from(["system", "user"]), words),
    st.lists(st.builds(turn, st.sampled_from(["system", "user", "assistant"]), words),
             max_size=4),
).map(lambda first_rest: [first_rest[0], *first_rest[1]])


@settings(max_examples=25, deadline=None)
@pytest.mark.filterwarnings("ignore:.*(truncated|skipped)")
@given(chats=st.lists(conversations, min_size=1, max_size=6), seq_len=st.integers(1, 12),
       packing=st.booleans(), seed=st.integers(0, 2**64 - 1), draws_before=st.integers(0, 9))
def test_any_conversations_mask_pack_and_resume_as_specified(toks, chats, seq_len, packing, seed,
                                                             draws_before):
    examples = [reference(chat) for chat in chats]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "chat.jsonl", [{"messages": chat} for chat in chats])

        def make() -> DatasetTokens:
            return source_of(path, toks["chat"], seq_len, packing=packing, seed=seed)

        try:
            source = make()
        except ValueError as err:  # nothing to train on, or too few tokens for a window
            assert "only" in str(err) or "no example has a token to train on" in str(err)
            return
        trained = [sum(flags[1:seq_len + 1]) if not packing else sum(flags)
                   for _, flags in examples]
        kept = [i for i, count in enumerate(trained) if count]
        assert sorted(source.epoch_order(0).tolist()) == kept
        assert source.num_trained == sum(trained)
        assert epoch_rows(source) + epoch_rows(source) == (expected_epoch(source, examples, 0)
                                                           + expected_epoch(source, examples, 1))
        resumes_identically(make, draws_before)


def chat_file(tmp: Path, *records: dict) -> Path:
    return write(tmp / "c.jsonl", list(records))


USER_ANSWER = {"messages": [turn("user", "cat"), turn("assistant", "dog")]}
# Each case: tmp folder -> open_token_source arguments (tokenizer by name); then the message.
REFUSED = {  # case: (tmp folder -> open_token_source arguments, tokenizer by name; message)
    "no chat template": (
        lambda t: {"spec": chat_file(t, USER_ANSWER), "tok": "plain"},
        (r"tokenizer at .*plain has no chat template, which messages data is rendered with; "
         r"use the model's own chat \(instruct\) tokenizer")),
    "unknown shape": (
        lambda t: {"spec": chat_file(t, {"question": "cat", "answer": "dog"})},
        (r"c\.jsonl records have fields \['answer', 'question'\], which fit no data format; "
         r"accepted: text \('text': str; .*messages \('messages'.*sharegpt 'conversations'.*"
         r"pass data_format \(one of auto, text, messages, alpaca, prompt_completion\) and "
         r"text_field")),
    "another text field": (
        lambda t: {"spec": chat_file(t, {"body": "cat"}), "text_field": "txt"},
        r"fields \['body'\], which fit no data format; accepted: text \('txt': str"),
    "ambiguous shape": (
        lambda t: {"spec": chat_file(t, {"text": "cat", **USER_ANSWER})},
        (r"fields \['messages', 'text'\] that fit several data formats \(text, messages\); "
         r"pass data_format as one of them")),
    "missing field": (
        lambda t: {"spec": chat_file(t, ALPACA[0], {"instruction": "cat"}),
                   "data_format": "alpaca"},
        r"c\.jsonl line 2 needs string 'instruction' and 'output' fields"),
    "named format absent": (
        lambda t: {"spec": chat_file(t, {"text": "cat"}), "data_format": "messages"},
        r"c\.jsonl line 1 has no non-empty list of messages in 'messages'"),
    "message without content": (
        lambda t: {"spec": chat_file(t, USER_ANSWER, {"messages": [turn("user", "cat"),
                                                                   {"role": "assistant"}]})},
        r"c\.jsonl line 2 message 1 of 'messages' needs string 'role' and 'content'"),
    "unknown sharegpt sender": (
        lambda t: {"spec": chat_file(t, {"conversations": [{"from": "human", "value": "cat"},
                                                           {"from": "bot", "value": "dog"}]})},
        (r"line 1 message 1 of 'conversations' is from 'bot'; sharegpt messages are from one "
         r"of human, user, gpt, assistant, system")),
    "replies under sharegpt roles": (
        lambda t: {"spec": chat_file(t, USER_ANSWER, {"messages": [turn("human", "cat"),
                                                                   turn("gpt", "dog")]})},
        (r"c\.jsonl line 2 has no assistant turn to train on, and roles 'human' \(message 0\), "
         r"'gpt' \(message 1\) are none of system, user, assistant, tool: the loss is on the "
         r"'assistant' turns; rename 'human' to 'user'; rename 'gpt' to 'assistant' \(sharegpt's "
         r"names belong in 'conversations'")),
    "replies under a role of its own": (
        lambda t: {"spec": chat_file(t, {"messages": [turn("user", "cat"),
                                                      turn("narrator", "dog")]})},
        (r"line 1 has no assistant turn to train on, and roles 'narrator' \(message 1\) are "
         r"none of .*rename 'narrator' to the role it plays \(system, user, assistant, tool\)$")),
    "completion under another role": (
        lambda t: {"spec": chat_file(t, {"prompt": [turn("user", "a")],
                                         "completion": [turn("bot", "b")]})},
        r"line 1 has no assistant turn .*'bot' \(message 1\).*rename 'bot' to 'assistant'$"),
    "mixed records in a file": (
        lambda t: {"spec": chat_file(t, {"text": "cat"}, {"text": "dog"}, USER_ANSWER)},
        (r"c\.jsonl mixes record formats: line 1 is a text record, line 3 is a messages "
         r"record; a run trains on one format: put each format's records in a file of their "
         r"own")),
    "a named format and a record of another": (
        lambda t: {"spec": chat_file(t, {"text": "cat"}, USER_ANSWER), "data_format": "text"},
        (r"c\.jsonl line 2 has no string field 'text'; add it, or pass .* as text_field \(it "
         r"is a messages record, not text: if the data mixes formats, put each format's records "
         r"in a file of their own")),
    "a text field with chat data": (
        lambda t: {"spec": chat_file(t, USER_ANSWER), "text_field": "body"},
        (r"^text_field 'body' names the field text records keep their text in, and the data "
         r"holds messages records, which are not read through it: drop text_field$")),
    "a text field with plain text": (
        lambda t: {"spec": put_text(t), "text_field": "text"},  # named, even as the default
        (r"^text_field 'text' names the field of JSON text records, and the data is plain text "
         r"\(each paragraph a document\), which has no fields: drop text_field$")),
    "attention across unpacked documents": (
        lambda t: {"spec": chat_file(t, USER_ANSWER), "document_mask": False},
        (r"^document_mask=False lets packed examples attend to each other, and these rows are "
         r"not packed \(messages data is not packed by default\): each row holds one example, "
         r"which attends only to itself; drop document_mask=False, or pass packing=True")),
    "attention across documents with packing off": (
        lambda t: {"spec": put_text(t), "document_mask": False, "packing": False},
        r"^document_mask=False .* and these rows are not packed \(packing=False\)"),
    "assistant first": (
        lambda t: {"spec": chat_file(t, {"messages": [turn("assistant", "a")]})},
        r"line 1 starts with an assistant turn, which has no prompt to render"),
    "template raises": (
        lambda t: {"spec": chat_file(t, TWO_CHATS[1]), "tok": "no_system"},
        (r"line 1 is refused by the tokenizer's chat template \(TemplateError: "
         r"no system turns\)")),
    "conversation without a template": (
        lambda t: {"spec": chat_file(t, {"prompt": [turn("user", "a")],
                                         "completion": [turn("assistant", "b")]}),
                   "tok": "plain"},
        r"line 1 has message lists as prompt and completion, which need a chat template"),
    "prompt and completion of two kinds": (
        lambda t: {"spec": chat_file(t, {"prompt": "a", "completion": 3})},
        r"line 1 needs 'prompt' and 'completion' fields, both strings or both lists"),
    "text as messages": (
        lambda t: {"spec": put_text(t), "data_format": "messages"},
        r"p\.txt is plain text, which is read as data_format 'text'"),
    "mixed formats": (
        lambda t: {"spec": mixed_folder(t)},
        (r"the data files hold different formats \(\{'a\.jsonl': 'alpaca', 'b\.txt': "
         r"'text'\}\); train on one format at a time")),
    "no pad or eos": (
        lambda t: {"spec": chat_file(t, {"prompt": "a", "completion": " b"}), "tok": "bare"},
        (r"unpacked rows need a pad token and the tokenizer has neither a pad nor an EOS "
         r"token; pass packing=True")),
    "nothing within seq_len": (
        lambda t: {"spec": chat_file(t, TWO_CHATS[1]), "seq_len": 3},
        r"no example has a token to train on within seq_len \+ 1 = 4 tokens"),
    "no assistant turn": (
        lambda t: {"spec": chat_file(t, {"messages": [turn("user", "a")]}), "packing": True},
        (r"^no example has a token to train on at all: messages data is trained on the "
         r"'assistant' turns, and no example has any; check the data's format and fields, or "
         r"pass train_on_prompt=True")),
    "no output at all, unpacked": (
        lambda t: {"spec": chat_file(t, {"instruction": "a", "output": ""}), "tok": "bare"},
        r"^no example has a token to train on at all: alpaca data is trained on the 'output'"),
    "bad train_on_prompt": (
        lambda t: {"spec": chat_file(t, USER_ANSWER), "train_on_prompt": "yes"},
        "train_on_prompt must be one of True, False, got 'yes'"),
}


def put_text(tmp: Path) -> Path:
    (tmp / "p.txt").write_text("the cat")
    return tmp / "p.txt"


def mixed_folder(tmp: Path) -> Path:
    write(tmp / "a.jsonl", ALPACA)
    (tmp / "b.txt").write_text("the cat")
    return tmp


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.filterwarnings("ignore:.*skipped")
def test_refuses_records_and_tokenizers_that_do_not_fit(toks, tmp_path, case):
    setup, match = REFUSED[case]
    args = {"tok": "chat", "seq_len": 8} | setup(tmp_path)
    tok, spec = toks[args.pop("tok")], args.pop("spec")
    with pytest.raises(ValueError, match=match):
        open_token_source(str(spec), tokenizer_dir=tok, vocab_size=len(VOCAB), **args)


def test_a_text_field_and_attention_across_documents_act_where_they_change_something(
        toks, tmp_path):
    write(tmp_path / "a.jsonl", [{"body": "the cat sat"}])
    (tmp_path / "b.txt").write_text("a dog ran")
    source = source_of(tmp_path, toks["chat"], seq_len=4, text_field="body", document_mask=False)
    assert (source.num_examples, source.packing, source.document_mask) == (2, True, False)
    # eval data is read with the training data's options, which are judged by the training data
    eval_source = source_of(tmp_path / "b.txt", toks["chat"], seq_len=2, text_field="body",
                            document_mask=False, role=EVAL_DATA)
    assert eval_source.num_examples == 1


def test_tool_turns_and_roles_beside_an_assistant_turn_are_rendered_not_trained(toks,
                                                                                 tmp_path):
    record = {"messages": [turn("user", "cat"), turn("tool", "dog"), turn("narrator", "a"),
                           turn("assistant", "sat")]}
    source = source_of(chat_file(tmp_path, record), toks["chat"], seq_len=16)
    _, labels, *_ = source.next_batch(1)
    assert [t for t in labels[0].tolist() if t != IGNORE_INDEX] == ids("sat <|end|>")


THOUGHTFUL = {"messages": [turn("user", "the cat"), turn("assistant", "<think> far </think> sat"),
                           turn("user", "a"), turn("assistant", "<think> away </think> dog")]}


def trained_labels(source: DatasetTokens) -> list[list[int]]:
    """Each row's labels that carry loss, in the first epoch's order."""
    return [[t for t in y if t != IGNORE_INDEX] for _, y in epoch_rows(source)]


def test_a_template_that_rewrites_earlier_turns_trains_the_turns_it_renders_the_same(toks,
                                                                                    tmp_path):
    """Qwen3-style: the first reply renders otherwise once a user turn follows it, so it is
    lost and said (by record, with how many it lost); the last reply is trained on."""
    path = chat_file(tmp_path, THOUGHTFUL, TWO_CHATS[0], THOUGHTFUL)
    with pytest.warns(UserWarning) as caught:
        source = source_of(path, toks["thinking"], seq_len=16)
    assert [str(w.message) for w in caught] == [(
        "2 conversations lost assistant turns to the tokenizer's chat template, which renders "
        "them otherwise once later turns follow (as templates that drop earlier turns' "
        f"reasoning do), so they are not trained on: {path} line 1 lost 1 of 2, line 3 lost 1 "
        "of 2; the turns it renders the same wherever they are (as a rule the last) are "
        "trained on. To train every turn, mark the assistant's turns in the chat template with "
        "{% generation %} ... {% endgeneration %}")]
    assert trained_labels(source) == [  # the last reply renders its (empty) reasoning
        ids("<think> </think> a dog <|end|>" if i == 1 else "<think> away </think> dog <|end|>")
        for i in source.epoch_order(0).tolist()]


def test_a_template_that_renders_no_turn_as_prompted_is_refused_saying_why(toks, tmp_path):
    """A generation prompt that no turn renders as: every turn is lost, and the refusal says
    that is why nothing is trained on (not the seq_len)."""
    path = chat_file(tmp_path, TWO_CHATS[0], TWO_CHATS[1])
    with pytest.warns(UserWarning, match=rf"^2 conversations lost .*: {path} line 1 lost 1 of "
                                         r"1, line 2 lost 2 of 2;"), pytest.raises(
            ValueError, match=(r"^no example has a token to train on: the tokenizer's chat "
                               r"template renders each assistant turn \(3 in all\) otherwise in "
                               r"the whole conversation than after its prompt.*\{% generation "
                               r"%\}.*or pass train_on_prompt=True")):
        source_of(path, toks["prompting"], seq_len=16)


def test_generation_markers_train_every_assistant_turn_as_the_template_renders_it(toks,
                                                                                  tmp_path):
    path = chat_file(tmp_path, THOUGHTFUL)
    source = source_of(path, toks["thinking_marked"], seq_len=16)
    assert epoch_rows(source) == [(
        ids("<s> <|user|> the cat <|end|> <|assistant|> sat <|end|> <|user|> a <|end|> "
            "<|assistant|> <think> away </think> dog"),
        ids("_ _ _ _ _ sat <|end|> _ _ _ _ <think> away </think> dog <|end|>"))]
    shots = chat_file(tmp_path, {"prompt": THOUGHTFUL["messages"][:3],  # a shot in the prompt
                                 "completion": [turn("assistant", "<think> a </think> mat")]})
    source = source_of(shots, toks["thinking_marked"], seq_len=16)
    assert trained_labels(source) == [ids("<think> a </think> mat <|end|>")]
    unmarked = source_of(shots, toks["thinking"], seq_len=16)
    assert trained_labels(unmarked) == trained_labels(source)


def test_an_inconsistent_template_still_trains_on_whole_conversations(toks, tmp_path):
    path = chat_file(tmp_path, TWO_CHATS[1])
    source = source_of(path, toks["forgetful"], seq_len=16, train_on_prompt=True)
    inputs, labels, *_ = source.next_batch(1)
    assert inputs[0].tolist() == ids("<s> <|system|> sat <|end|> <|user|> dog <|end|> "
                                     "<|assistant|> far <|end|> <|user|> a <|end|> <|assistant|> "
                                     "the <|end|>")
    assert labels[0].tolist() == [*inputs[0].tolist()[1:], IGNORE_INDEX]


def test_a_byte_order_mark_is_not_trained_on_nor_hides_a_bad_record(toks, tmp_path):
    with_mark, without = tmp_path / "marked.txt", tmp_path / "plain.txt"
    with_mark.write_text("\ufeffthe cat\n\na dog sat\n", encoding="utf-8")
    without.write_text("the cat\n\na dog sat\n", encoding="utf-8")
    assert epoch_rows(source_of(with_mark, toks["chat"], seq_len=4)) == epoch_rows(
        source_of(without, toks["chat"], seq_len=4))
    array = tmp_path / "marked.json"  # a JSON array: its bad record named, not a traceback
    array.write_text('\ufeff[{"text": "the cat"}, {"txt": "a dog"}, {"text": "sat"}]',
                     encoding="utf-8")
    with pytest.raises(ValueError, match=r"record 1 \(counting from 0\)"):
        source_of(array, toks["chat"], seq_len=4)


def test_a_pad_added_past_the_models_vocabulary_pads_with_eos(toks, tmp_path):
    from transformers import AutoTokenizer

    added = AutoTokenizer.from_pretrained(toks["chat"])
    added.add_special_tokens({"pad_token": "<extra-pad>"})  # id len(VOCAB): past the model's
    added.save_pretrained(tmp_path / "added")
    assert added.pad_token_id == len(VOCAB)
    source = source_of(write(tmp_path / "chat.jsonl", TWO_CHATS), tmp_path / "added",
                       seq_len=16)
    with_eos = [(x.replace("<pad>", "</s>"), y) for x, y in TWO_CHATS_ROWS]
    assert epoch_rows(source) == by_example(source, with_eos)
