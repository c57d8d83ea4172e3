"""Fixtures shared by the tests: round-number models and profiles (see helpers.py), and small
filesystems for the outputs' space checks."""

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
