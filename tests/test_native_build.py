"""native_build: a C source compiled once and cached; a failed build said once and remembered."""

import ctypes
import shutil

import pytest

from layerslide.native_build import build

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler here")
FLAGS = ("-O2", "-shared", "-fPIC")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    return tmp_path / "cache" / "layerslide"


def test_a_source_is_built_once_and_loads(tmp_path, cache):
    source = tmp_path / "twice.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    path = build(source, FLAGS, "using Python")
    assert path is not None and path.parent == cache
    built_at = path.stat().st_mtime_ns
    assert build(source, FLAGS, "using Python") == path
    assert path.stat().st_mtime_ns == built_at  # taken from the cache, not rebuilt
    assert ctypes.CDLL(str(path)).twice(21) == 42


def test_a_failed_build_is_said_once_and_remembered(tmp_path, cache, capsys):
    source = tmp_path / "broken.c"
    source.write_text("int broken( {\n")
    assert build(source, FLAGS, "using Python") is None
    said = capsys.readouterr().err
    assert "broken.c did not compile, using Python" in said and ".failed" in said
    failed = next(cache.glob("broken-*.failed"))
    assert "error" in failed.read_text()
    assert build(source, FLAGS, "using Python") is None
    assert capsys.readouterr().err == ""  # remembered: not tried, not said again
    failed.unlink()  # as the message says: deleting it tries again
    assert build(source, FLAGS, "using Python") is None
    assert "did not compile" in capsys.readouterr().err


def test_a_compiler_that_cannot_run_leaves_the_caller_its_fallback(tmp_path, cache,
                                                                   monkeypatch, capsys):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    source = tmp_path / "twice.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    assert build(source, FLAGS, "using Python") is None
    assert "cannot run" in capsys.readouterr().err


def test_layerslide_native_0_builds_nothing(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("LAYERSLIDE_NATIVE", "0")
    source = tmp_path / "twice.c"
    source.write_text("int twice(int x) { return 2 * x; }\n")
    assert build(source, FLAGS, "using Python") is None
    assert not cache.exists()
