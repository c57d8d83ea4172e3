"""Fixtures shared by the planner, simulator and tuner tests (see helpers.py), and an offline
Hugging Face home for the tests of Hub names."""

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec


@pytest.fixture
def tiny_model() -> ModelSpec:
    return make_tiny_model()


@pytest.fixture
def round_profile() -> HardwareProfile:
    return make_round_profile()


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hugging Face home (HF_HOME) in offline mode, for this process and those it
    starts, with the network blocked: what a test puts in its caches (helpers.cache_hub_model,
    cache_hub_dataset) is all there is."""
    from pathlib import Path

    import datasets
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    for name, value in (("HF_HOME", str(home)), ("HF_HUB_OFFLINE", "1"),
                        ("HF_DATASETS_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    # the libraries read these at import: set them as the environment would have
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(home / "datasets"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    block_network(monkeypatch)
    return home


def block_network(monkeypatch) -> None:
    """Fail every connection and name lookup, as a machine without a network does."""
    import socket

    def unreachable(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
