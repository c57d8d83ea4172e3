"""Hugging Face Hub names: which names are read as Hub names, and model ids resolved to their
snapshot in huggingface_hub's cache offline, or refused saying why (no network is tried)."""

from __future__ import annotations

import json

import pytest
from conftest import block_network
from helpers import COMMIT, cache_hub_model

from layerslide import hub


def test_names_are_hub_names_only_where_no_path_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert hub.is_model_id("Qwen/Qwen3-8B") and hub.is_model_id("meta-llama/Llama-3.2-1B")
    for not_an_id in ("models/mine", "llama-3.2-1b", "a/b/c", "runs/config.json", "/abs/x",
                      "./x/y", "~/x"):
        assert not hub.is_model_id(not_an_id), not_an_id
    assert hub.dataset_name("tatsu-lab/alpaca") == ("tatsu-lab/alpaca", None)
    assert hub.dataset_name("imdb:test") == ("imdb", "test")
    assert hub.dataset_name("owner/set:train[:10%]") == ("owner/set", "train[:10%]")
    for not_a_name in ("models/mine", "data.jsonl", "d/train.parquet", "x:", "a/b/c", "/x"):
        assert hub.dataset_name(not_a_name) is None, not_a_name
    assert hub.model_name("Qwen/Qwen3-8B") == "Qwen3-8B"


def test_a_model_id_resolves_to_its_snapshot_in_the_cache_offline(offline_hub, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    cache_hub_model(offline_hub, "someone/tiny", folder)
    snapshot = offline_hub / "hub" / "models--someone--tiny" / "snapshots" / COMMIT
    assert hub.model_folder("someone/tiny") == snapshot
    assert hub.model_folder("someone/tiny", hub.CONFIG_FILES) == snapshot
    assert (snapshot / "model.safetensors").read_bytes() == b"weights"


def test_a_model_neither_cached_nor_reachable_is_refused_saying_why(offline_hub, monkeypatch):
    cache = offline_hub / "hub"
    with pytest.raises(ValueError, match=(
            rf"^model 'someone/absent' is no preset or path here, and as a Hugging Face Hub id "
            rf"it is not in the cache \({cache}\), and HF_HUB_OFFLINE is set, so the Hub is not "
            r"asked: download the model once with the network on \(HF_HUB_OFFLINE unset\), or "
            r"pass a local path$")):
        hub.model_folder("someone/absent")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, and no network
    block_network(monkeypatch)
    with pytest.raises(ValueError, match=(
            r"it is not in the cache \(.*\), and the Hub cannot be reached: connect to the "
            r"network once to download the model, or pass a local path$")):
        hub.model_folder("someone/absent")


def _hub_refusing(monkeypatch, error_class):
    """snapshot_download answering as the Hub does for a gated or unknown/private repo."""
    import httpx2
    import huggingface_hub

    def refuse(repo_id, **_):
        request = httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
        response = httpx2.Response(403 if error_class.__name__ == "GatedRepoError" else 404,
                                   request=request)
        raise error_class(f"{repo_id}: refused", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


def test_a_gated_model_says_to_accept_its_terms_and_log_in(monkeypatch):
    from huggingface_hub import errors

    _hub_refusing(monkeypatch, errors.GatedRepoError)
    with pytest.raises(ValueError, match=(
            r"'meta-llama/Llama-3.1-8B' .* it is gated: accept its terms at "
            r"https://huggingface.co/meta-llama/Llama-3.1-8B and log in \(`hf auth login`\), or "
            r"pass the model's folder$")):
        hub.model_folder("meta-llama/Llama-3.1-8B")


def test_a_private_or_unknown_model_says_to_log_in_or_check_the_id(monkeypatch):
    from huggingface_hub import errors

    _hub_refusing(monkeypatch, errors.RepositoryNotFoundError)
    with pytest.raises(ValueError, match=(
            r"'someone/secret' .* it is not on the Hub \(or it is private: log in with `hf auth "
            r"login`\); check the id, or pass the model's folder$")):
        hub.model_folder("someone/secret")


@pytest.mark.parametrize(("failure", "answers"), [
    (OSError("Name or service not known"), False),
    (type("ConnectTimeout", (OSError,), {})("slow proxy"), True)])
def test_a_hub_that_is_slow_is_left_to_the_libraries_and_one_not_there_is_not(
        monkeypatch, failure, answers):
    """No answer at all: datasets reads its cache at once; a timeout: the Hub may be there
    behind a slow proxy, so datasets still asks it (and downloads what the cache lacks)."""
    import datasets
    from huggingface_hub import utils

    from layerslide.hub import cache_only_unless_the_hub_answers, hub_answers

    class Session:
        def head(self, url, timeout):
            raise failure

    monkeypatch.setattr(utils, "get_session", Session)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    assert hub_answers() is answers
    with cache_only_unless_the_hub_answers() as asked:
        assert not asked and datasets.config.HF_HUB_OFFLINE is (not answers)
    assert datasets.config.HF_HUB_OFFLINE is False
