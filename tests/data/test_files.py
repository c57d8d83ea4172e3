"""Hub datasets by name (`name`, `owner/name`, either with `:split`): loaded by `datasets`
through its own cache offline, with a cache the test prepares, or refused saying why (no
network is tried). Local files: test_sources.py and test_formats.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import block_network
from helpers import cache_hub_dataset

from layerslide.data.sources import DatasetTokens, open_token_source

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]
TRAIN = [{"text": " ".join(WORDS[i:i + 3])} for i in range(6)]
TEST = [{"text": "the dog ran far"}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer: [UNK] 0, </s> 1, then WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>",
                            unk_token="[UNK]").save_pretrained(path)
    return path


def hub_source(spec: str, tok_dir, seq_len: int = 3) -> DatasetTokens:
    source = open_token_source(spec, tokenizer_dir=tok_dir, vocab_size=12, seq_len=seq_len)
    assert isinstance(source, DatasetTokens)
    return source


def test_a_hub_datasets_split_loads_offline_from_datasets_cache(offline_hub, tok_dir):
    cache_hub_dataset(offline_hub, "someone/tinytext", {"train": TRAIN, "test": TEST})
    whole = hub_source("someone/tinytext", tok_dir)  # its train split
    assert (whole.files, whole.num_examples) == (["someone/tinytext:train"], 6)
    assert whole.describe().startswith("text data from someone/tinytext:train: 6 examples")
    test = hub_source("someone/tinytext:test", tok_dir, seq_len=2)
    assert (test.files, test.num_examples, test.num_tokens) == (["someone/tinytext:test"], 1, 5)
    inputs, _, _ = test.next_batch(2)
    assert inputs.tolist() == [[2, 8], [9, 10]]  # the dog | ran far (</s> the last label)


def test_a_hub_dataset_neither_cached_nor_reachable_is_refused_saying_why(offline_hub, tok_dir,
                                                                         monkeypatch):
    cache = offline_hub / "datasets"
    with pytest.raises(ValueError, match=(
            rf"^data 'someone/absent' is no path here, and as a Hugging Face Hub dataset it is "
            rf"not in datasets' cache \({cache}\), and HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is "
            r"set, so the Hub is not asked: download it once with the network on \(HF_HUB_OFFLINE "
            r"or HF_DATASETS_OFFLINE unset\), or pass a local path$")):
        hub_source("someone/absent:train", tok_dir)
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, and no network
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    block_network(monkeypatch)
    with pytest.raises(ValueError, match=r"not in datasets' cache .*, and the Hub cannot be "
                                         r"reached: connect to the network once"):
        hub_source("someone/absent", tok_dir)


def test_a_cached_hub_dataset_loads_at_once_where_the_hub_does_not_answer(offline_hub, tok_dir,
                                                                         monkeypatch):
    """Online mode with no network: one request finds the Hub silent and datasets reads its
    cache at once (on its own it retries for ~25 s first); offline mode is put back after."""
    import socket

    import datasets
    from huggingface_hub import constants

    cache_hub_dataset(offline_hub, "someone/tinytext", {"train": TRAIN, "test": TEST})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    lookups = []

    def no_network(*args, **kwargs):
        lookups.append(args[:1])
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    assert hub_source("someone/tinytext", tok_dir).num_examples == 6
    assert len(lookups) == 1  # the probe's, and no retries
    assert not datasets.config.HF_HUB_OFFLINE and not constants.HF_HUB_OFFLINE


def test_a_split_a_hub_dataset_lacks_is_refused_with_its_splits(offline_hub, tok_dir):
    cache_hub_dataset(offline_hub, "someone/tinytext", {"train": TRAIN, "test": TEST})
    with pytest.raises(ValueError, match=(
            r"^datasets cannot load Hub dataset 'someone/tinytext' split 'validation' "
            r"\(ValueError: .*\['train', 'test'\].*\); name one of its splits as "
            r"someone/tinytext:SPLIT")):
        hub_source("someone/tinytext:validation", tok_dir)
    cache_hub_dataset(offline_hub, "someone/evalonly", {"test": TEST})
    with pytest.raises(ValueError, match=(r"^Hub dataset 'someone/evalonly' has splits "
                                          r"\['test'\] and no 'train'; name the one to train "
                                          r"on, e.g. someone/evalonly:test$")):
        hub_source("someone/evalonly", tok_dir)
