"""No traceback escapes the commands, whatever their arguments, profiles or data files: exit 0,
1 (an infeasible plan), or 2 with a message (argparse's or layerslide's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerslide.cli.main import main

NUMBERS = ["0", "1", "2", "-1", "0.5", "1.5", "1e9", "nan", "x", ""]
SIZES = ["24GiB", "1MiB", "0", "-5GB", "lots", "1e30B"]
FLAGS = {
    "--micro-batch": NUMBERS, "--seq-len": NUMBERS + ["1024"], "--grad-accum": NUMBERS,
    "--window": NUMBERS, "--prefetch-depth": NUMBERS, "--grad-buffers": NUMBERS,
    "--moments-on-nvme": NUMBERS, "--master-on-nvme": NUMBERS, "--weights-on-nvme": NUMBERS,
    "--resident-layers": NUMBERS, "--gpu-updated-blocks": NUMBERS,
    "--max-grad-norm": NUMBERS, "--sweep-groups": NUMBERS, "--nvme-drives": NUMBERS,
    "--gpu-memory": SIZES, "--activations": ["gpu", "host", "nvme", "disk"],
    "--cast": ["cpu_once", "gpu", "tpu"], "--accumulation": ["layer_major", "sideways"],
    "--cpu-optimizer": ["native", "torch", "adam"], "--profile": ["h200-bench", "rtx4090-256gb",
                                                                  "no-such-box"],
}
MODELS = ["llama-3.2-1b", "qwen3-4b", "no-such-model", "/no/such/folder"]


def arguments():
    pairs = st.lists(st.sampled_from(sorted(FLAGS)).flatmap(
        lambda flag: st.tuples(st.just(flag), st.sampled_from(FLAGS[flag]))), max_size=4)
    return st.tuples(st.sampled_from(["plan", "simulate"]), st.sampled_from(MODELS), pairs)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse refuses with exit 2 and its usage message
        return stop.code


# capsys is read out per example, so what one prints never reaches the next
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(arguments())
def test_planning_commands_exit_cleanly_whatever_the_flags(capsys, case):
    command, model, pairs = case
    argv = [command, "--model", model, *[part for pair in pairs for part in pair]]
    if command == "plan":
        argv = [a for a in argv if a not in ("--profile", "--nvme-drives")]
    code = exit_code(argv)
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (argv, code)
    assert "Traceback" not in err
    if code == 2:
        assert "error" in err, argv  # says what is wrong


@pytest.mark.parametrize("content", ["", "not json", "[]", json.dumps({"format": 99}),
                                     json.dumps({"model": {}, "train": {}}), "\x00\xff"])
def test_a_damaged_plan_file_is_refused_with_a_message(tmp_path, capsys, content):
    path = tmp_path / "plan.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape") if isinstance(content, str)
                     else content)
    assert exit_code(["simulate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "plan.json" in err and "Traceback" not in err


PROFILE_LINES = (Path(__file__).resolve().parents[2] / "layerslide" / "hwprofiles" / "builtin"
                 / "h200-bench.toml").read_text().splitlines()
JUNK_VALUES = ['{ value = -1, unit = "GB/s", source = "x" }', '{ value = 0, unit = "GiB" }',
               '{ value = 3, unit = "furlongs", source = "x" }', '"fast"', "12", "[]",
               '{ value = "lots", unit = "TB/s", source = "x" }', "{ value = 1e400 }", "= ="]


def mutated_profiles():
    """h200-bench.toml with a few lines replaced by junk values, deleted or doubled."""
    edit = st.tuples(st.integers(0, len(PROFILE_LINES) - 1),
                     st.sampled_from(["junk", "delete", "double"]), st.sampled_from(JUNK_VALUES))
    return st.lists(edit, min_size=1, max_size=3)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated_profiles())
def test_a_damaged_profile_is_refused_with_a_message_or_used(tmp_path, capsys, edits):
    lines = list(PROFILE_LINES)
    for index, action, junk in edits:
        index %= len(lines)
        if action == "delete":
            del lines[index]
        elif action == "double":
            lines.insert(index, lines[index])
        elif "=" in lines[index] and not lines[index].startswith("#"):
            lines[index] = lines[index].split("=", 1)[0] + "= " + junk
    path = tmp_path / "box.toml"
    path.write_text("\n".join(lines) + "\n")
    code = exit_code(["simulate", "--model", "llama-3.2-1b", "--profile", str(path)])
    err = capsys.readouterr().err
    assert code in (0, 1, 2), (edits, code)
    assert "Traceback" not in err
    if code == 2:
        assert "box.toml" in err, err  # names the file it refuses


VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
                                st.sampled_from(["", "the cat sat", "user", "assistant"])),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(["role", "content", "from", "value"]),
                                        inner, max_size=2), max_leaves=6)
WILD_RECORDS = st.dictionaries(st.sampled_from(["text", "messages", "conversations", "instruction",
                                                "input", "output", "prompt", "completion",
                                                "other"]), VALUES, max_size=3)
SENTENCES = st.lists(st.sampled_from(["the", "cat", "sat", "dog"]), max_size=6).map(" ".join)
TURNS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                        "content": SENTENCES}), min_size=1, max_size=3)
RECORDS = st.one_of(
    WILD_RECORDS, st.fixed_dictionaries({"text": SENTENCES}),
    st.fixed_dictionaries({"messages": TURNS}),
    st.fixed_dictionaries({"instruction": SENTENCES, "output": SENTENCES},
                          optional={"input": SENTENCES}),
    st.fixed_dictionaries({"prompt": SENTENCES, "completion": SENTENCES}))


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("fuzz-llama")
    words = ["[UNK]", "</s>", "the", "cat", "sat", "dog", "user", "assistant", "system"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="[UNK]",
                            chat_template=CHAT_TEMPLATE).save_pretrained(path)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, vocab_size=16,
                                 max_position_embeddings=32)).save_pretrained(path)
    return path


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(RECORDS, min_size=1, max_size=4), st.integers(1, 40))
def test_any_data_file_trains_or_is_refused_with_a_message(tiny_folder, tmp_path, capsys,
                                                          records, copies):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records * copies))
    code = exit_code(["train", "--model", str(tiny_folder), "--data", str(path), "--device",
                      "cpu", "--steps", "1", "--micro-batch", "1", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert code in (0, 2), (records, code, err[-2000:])
    assert "Traceback" not in err
    if code == 2:
        assert "error: " in err and "datasets cannot read" not in err, err  # says what to change
