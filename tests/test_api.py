"""The package's top-level names, and the README's Python API example run as written."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import layerslide

README = Path(__file__).resolve().parents[1] / "README.md"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away"]


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_every_exported_name_resolves_and_import_needs_no_torch():
    assert all(getattr(layerslide, name) is not None for name in layerslide.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = layerslide.nothing
    code = ("import sys, layerslide; assert 'torch' not in sys.modules; "
            "layerslide.Policy.of(); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_readme_example_trains_a_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "tiny-llama"
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=32,
                                 max_position_embeddings=64)).save_pretrained(folder)
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"text": " ".join(WORDS[i % 5:i % 5 + 6])})
                              for i in range(200)) + "\n")
    code = readme_example().replace('"path/to/llama-folder"', repr(str(folder))).replace(
        '"train.jsonl"', repr(str(data)))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102
    assert (tmp_path / "tuned-model" / "model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert re.search(r"eval loss \d+\.\d{3}", printed), printed
