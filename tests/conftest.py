"""Fixtures shared by the tests: round-number models and profiles (see helpers.py), small
filesystems for the outputs' space checks, and an offline Hugging Face home for the tests of
Hub names."""

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec


@pytest.fixture
def tiny_model() -> ModelSpec:
    return make_tiny_model()


@pytest.fixture
def tiny_config_folder(tmp_path) -> str:
    """A folder holding only the config.json of a 2-layer Llama named "tiny" (what tune and
    what-if read of a model)."""
    import json

    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    return str(folder)


@pytest.fixture
def round_profile() -> HardwareProfile:
    return make_round_profile()


class SmallDisk:
    """A folder on a filesystem of `size_bytes`: a tmpfs mounted for the test where it runs as
    root (`real`: writes there fail for space as on a full disk), else a folder whose free
    space the free-space query (layerslide.outputs.free_bytes) reports as that size."""

    def __init__(self, path, size_bytes: int, real: bool):
        self.path, self.size_bytes, self.real = path, size_bytes, real

    def fill(self, leave_bytes: int = 0) -> None:
        """Take the room left on a real one (but leave_bytes), as another process might."""
        import shutil

        if not self.real:
            import pytest
            pytest.skip("filling a disk mid-run needs a small tmpfs (tests run as root)")
        take = shutil.disk_usage(self.path).free - leave_bytes
        with open(self.path / ".filler", "ab") as f:
            try:
                f.write(b"\0" * max(0, take))
                f.flush()
            except OSError:
                pass  # full: what was asked for

    def free(self) -> None:
        (self.path / ".filler").unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """small_disk(size_bytes) -> a SmallDisk, unmounted after the test."""
    import os
    import subprocess
    from pathlib import Path

    import layerslide.outputs

    mounted = []

    def make(size_bytes: int) -> SmallDisk:
        path = tmp_path / f"small-disk-{len(mounted)}"
        path.mkdir()
        if os.geteuid() == 0 and subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                capture_output=True, check=False).returncode == 0:
            mounted.append(path)
            return SmallDisk(path, size_bytes, real=True)
        real_free = layerslide.outputs.free_bytes

        def free_bytes(where) -> int:
            inside = Path(where).expanduser().absolute().is_relative_to(path)
            return size_bytes if inside else real_free(where)
        monkeypatch.setattr(layerslide.outputs, "free_bytes", free_bytes)
        return SmallDisk(path, size_bytes, real=False)

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


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
