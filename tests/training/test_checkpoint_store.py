"""Checkpoint store: round trips, rotation, atomicity under kill -9 and disk full, corruption."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from layerslide.training import checkpoint_store as cs
from layerslide.training.checkpoint_store import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointSpaceError,
    CheckpointStore,
)

REPO = Path(__file__).resolve().parents[2]


def make_groups(seed: int, n: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    groups = {}
    for i in range(-1, n - 1):
        groups[f"block_{i}"] = {
            "master": torch.randn(1000 + 37 * i, generator=gen),
            "exp_avg": torch.randn(3, 5, generator=gen).to(torch.bfloat16),
            "count": torch.randint(-2**40, 2**40, (7,), generator=gen),
            "scalar": torch.tensor(float(seed)),
            "empty": torch.empty(0),
        }
    return groups


def zeros_like(groups):
    return {g: {n: torch.zeros_like(t) for n, t in ts.items()} for g, ts in groups.items()}


def assert_bit_equal(a, b):
    assert a.keys() == b.keys()
    for g in a:
        assert a[g].keys() == b[g].keys()
        for n in a[g]:
            x, y = a[g][n], b[g][n]
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))


def tmp_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))


META = {"step": 1, "optim": {"lr": 1e-5, "betas": [0.9, 0.95]}, "rng": list(range(700)),
        "data": {"epoch": 0, "position": 12345}, "model": "tiny"}


def test_round_trip_list_latest_and_rotation(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2, writer_threads=2)
    assert store.list() == [] and store.latest() is None
    saved = {}
    for step in range(1, 6):
        saved[step] = make_groups(step)
        info = store.save(step, saved[step], {**META, "step": step})
        assert info.step == step and info.path.name == f"step-{step:09d}"
        assert info.total_bytes == sum(p.stat().st_size for p in info.path.glob("*.bin"))
    assert [i.step for i in store.list()] == [4, 5]
    assert sorted(p.name for p in store.root.iterdir()) == ["step-000000004", "step-000000005"]
    assert store.latest().step == 5 and store.latest().meta == {**META, "step": 5}
    for info in store.list():
        into = zeros_like(saved[info.step])
        assert store.load(info, into) == {**META, "step": info.step}
        assert_bit_equal(into, saved[info.step])
        store.verify(info.path)
    manifest = json.loads((store.latest().path / "manifest.json").read_text())
    offsets = [t["offset"] for t in manifest["groups"]["block_0"]["tensors"]]
    assert all(o % 4096 == 0 for o in offsets) and offsets == sorted(set(offsets))


def test_resave_same_step_replaces_it_and_interrupted_replace_is_restored(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(3, make_groups(1), {"v": 1})
    new = make_groups(2)
    store.save(3, new, {"v": 2})
    into = zeros_like(new)
    assert [i.step for i in store.list()] == [3] and store.load(store.latest(), into) == {"v": 2}
    assert_bit_equal(into, new)
    # a crash between moving the old one aside and renaming the new one in
    os.rename(tmp_path / "step-000000003", tmp_path / ".tmp-old-step-000000003-99999")
    assert CheckpointStore(tmp_path).latest().meta == {"v": 2}


def test_large_group_is_chunked_with_progress(tmp_path):
    big = {"block_0": {"master": torch.arange(52_000_000, dtype=torch.float32),  # ~208 MB
                       "tail": torch.ones(3, dtype=torch.bfloat16)}}
    store = CheckpointStore(tmp_path)
    calls = []
    store.save(1, big, {}, progress=lambda done, total: calls.append((done, total)))
    total = 52_000_000 * 4 + 6
    assert len(calls) >= 5 and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    into = zeros_like(big)
    store.load(store.latest(), into)
    assert_bit_equal(into, big)


KILL_SCRIPT = r"""
import os, signal, sys
import torch
from layerslide.training import checkpoint_store as cs

root, mode = sys.argv[1], sys.argv[2]
cs.CHUNK = 1 << 16  # so the kill lands inside a tensor
store = cs.CheckpointStore(root, keep_last=5, writer_threads=2)
groups = lambda v: {f"block_{i}": {"w": torch.full((300_000,), float(v))} for i in range(3)}
store.save(1, groups(1), {"step": 1})
real_write, real_pwrite, real_rename, written = os.write, os.pwrite, os.rename, [0]

def write(fd, data):  # the manifest's
    if mode == "manifest" and bytes(data[:10]) == b'{"format":':
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(fd, data)

def pwrite(fd, data, offset):  # the tensors'
    written[0] += len(data)
    if mode == "data" and written[0] > 500_000:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_pwrite(fd, data, offset)

def rename(src, dst):
    if mode == "rename":
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rename(src, dst)

os.write, os.pwrite, os.rename = write, pwrite, rename
store.save(2, groups(2), {"step": 2})
sys.exit(3)
"""


KILL_MODES = ["data", "manifest", "rename"]


@pytest.fixture(scope="module")
def killed_writers(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """Runs the kill script once per mode, concurrently (each pays torch's import time)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    roots = {mode: tmp_path_factory.mktemp(f"kill_{mode}") for mode in KILL_MODES}
    procs = {mode: subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root), mode],
                                    env=env, stderr=subprocess.PIPE, text=True)
             for mode, root in roots.items()}
    stderrs = {mode: p.communicate(timeout=60)[1] for mode, p in procs.items()}
    return {mode: (roots[mode], p.returncode, stderrs[mode]) for mode, p in procs.items()}


@pytest.mark.parametrize("mode", KILL_MODES)
def test_kill_9_mid_save_leaves_earlier_checkpoint(killed_writers, mode):
    tmp_path, returncode, stderr = killed_writers[mode]
    assert returncode == -signal.SIGKILL, stderr
    store = CheckpointStore(tmp_path, keep_last=5)
    assert [i.step for i in store.list()] == [1]
    store.verify(store.latest())
    assert [d[:len(".tmp-step-000000002")] for d in tmp_dirs(tmp_path)] == [".tmp-step-000000002"]
    if mode == "manifest":  # killed while writing it: created, still empty
        assert next(tmp_path.glob(".tmp-*/manifest.json")).stat().st_size == 0
    groups = make_groups(3)
    store.save(3, groups, {})
    assert [i.step for i in store.list()] == [1, 3] and tmp_dirs(tmp_path) == []
    into = {"block_0": {"w": torch.zeros(300_000)}, "block_1": {"w": torch.zeros(300_000)},
            "block_2": {"w": torch.zeros(300_000)}}
    assert store.load(store.list()[0], into) == {"step": 1}
    assert all(torch.all(g["w"] == 1) for g in into.values())


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_failed_write_deletes_partial_and_keeps_earlier(tmp_path, monkeypatch, err):
    store = CheckpointStore(tmp_path, writer_threads=2)
    store.save(1, make_groups(1), {"step": 1})
    monkeypatch.setattr(cs, "CHUNK", 1 << 10)
    real_pwrite, written = os.pwrite, [0]

    def pwrite(fd, data, offset):
        written[0] += len(data)
        if written[0] > 6000:
            raise OSError(err, os.strerror(err))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(CheckpointError, match=r"\.tmp-step-000000002-\d+/block_.*\.bin") as e:
        store.save(2, make_groups(2), {"step": 2})
    assert isinstance(e.value, CheckpointSpaceError) == (err == errno.ENOSPC)
    assert os.strerror(err) in str(e.value)
    if err == errno.ENOSPC:
        assert "--checkpoint-dir" in str(e.value)
    monkeypatch.undo()
    assert [i.step for i in store.list()] == [1] and tmp_dirs(tmp_path) == []
    store.verify(store.latest())


def test_failing_progress_callback_aborts_cleanly(tmp_path):
    store = CheckpointStore(tmp_path)

    def progress(done, total):
        raise RuntimeError("callback bug")

    with pytest.raises(RuntimeError, match="callback bug"):
        store.save(1, make_groups(1), {}, progress=progress)
    assert store.list() == [] and list(tmp_path.iterdir()) == []


def test_check_space_refuses_before_writing(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    groups = make_groups(1)
    need = store.required_bytes(groups) + cs.MANIFEST_SLACK
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=12345))
    with pytest.raises(CheckpointSpaceError, match=rf"needs {need} bytes.* 12345 bytes"):
        store.save(1, groups, {})
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def two_saved(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=5)
    old, new = make_groups(1), make_groups(2)
    store.save(1, old, {"step": 1})
    store.save(2, new, {"step": 2})
    return store, old, new


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def test_flipped_byte_is_named_and_fallback_uses_previous(two_saved):
    store, old, new = two_saved
    latest = store.latest()
    manifest = json.loads((latest.path / "manifest.json").read_text())
    entry = next(t for t in manifest["groups"]["block_1"]["tensors"] if t["name"] == "exp_avg")
    flip_byte(latest.path / "block_1.bin", entry["offset"] + 3)
    assert [i.step for i in store.list()] == [1, 2]  # same size: only checksums see it
    with pytest.raises(CheckpointCorruptError, match=r"'exp_avg' in .*block_1\.bin fails"):
        store.verify(latest)
    with pytest.raises(CheckpointCorruptError, match=r"'exp_avg' in .*block_1\.bin"):
        store.load(latest, zeros_like(new))
    with pytest.raises(CheckpointCorruptError, match=r"block_1\.bin"):
        store.load_latest_good(zeros_like(new), fallback=False)
    into = zeros_like(old)
    with pytest.warns(RuntimeWarning, match="step-000000002") as said:
        info, meta = store.load_latest_good(into, fallback=True)
    assert info.step == 1 and meta == {"step": 1}
    assert_bit_equal(into, old)
    # the damaged one is set aside: the resumed run's newest and its rotation see only good ones
    assert any("set aside as damaged-step-000000002" in str(w.message) for w in said)
    assert (store.root / "damaged-step-000000002").is_dir()
    assert [i.step for i in store.list()] == [1] and store.latest().step == 1


def test_truncated_file_and_bad_manifest(two_saved):
    store, old, new = two_saved
    latest = store.latest().path
    with open(latest / "block_0.bin", "r+b") as f:
        f.truncate(100)
    assert [i.step for i in store.list()] == [1]
    with pytest.raises(CheckpointCorruptError, match=r"block_0\.bin is 100 bytes, its manifest"):
        store.verify(latest)
    with pytest.raises(CheckpointCorruptError, match="100 bytes"):
        store.load(latest, zeros_like(new))
    with pytest.raises(CheckpointCorruptError):  # damaged, not silently skipped
        store.load_latest_good(zeros_like(new), fallback=False)
    with pytest.warns(RuntimeWarning):
        assert store.load_latest_good(zeros_like(old), fallback=True)[0].step == 1
    first = store.list()[0].path
    (first / "manifest.json").write_text('{"format": "layerslide-checkpoint", "vers')
    assert store.list() == []
    with pytest.raises(CheckpointCorruptError, match="malformed"):
        store.load(first, zeros_like(old))
    (first / "manifest.json").unlink()
    with pytest.raises(CheckpointCorruptError, match=r"manifest\.json is missing"):
        store.verify(first)
    # (the truncated step 2 was set aside by the fallback above: one step folder is left)
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointCorruptError, match="all 1 "):
        store.load_latest_good(zeros_like(old), fallback=True)
    assert (store.root / "damaged-step-000000002").is_dir()  # nothing loaded: none set aside
    assert (store.root / "step-000000001").is_dir()


def test_load_mismatches_are_listed(two_saved):
    store, _, new = two_saved
    into = zeros_like(new)
    del into["block_0"]["master"]
    into["block_1"]["exp_avg"] = torch.zeros(5, 3, dtype=torch.bfloat16)
    into["block_-1"]["count"] = torch.zeros(7, dtype=torch.int32)
    into["block_9"] = {"x": torch.zeros(1)}
    with pytest.raises(ValueError, match="does not fit") as e:
        store.load(store.latest(), into)
    msg = str(e.value)
    for part in ["block_0/master is in the checkpoint only", "bfloat16[3, 5] in the checkpoint",
                 "bfloat16[5, 3] here", "int64[7] in the checkpoint, int32[7] here",
                 "group 'block_9' is not in the checkpoint"]:
        assert part in msg


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "x y", "é"])
def test_bad_group_name(tmp_path, bad):
    with pytest.raises(ValueError, match="safe file name"):
        CheckpointStore(tmp_path).save(1, {bad: {"w": torch.zeros(2)}}, {})
    assert list(tmp_path.iterdir()) == []


def test_refused_inputs(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match="block_0/w must be a contiguous CPU tensor"):
        store.save(1, {"block_0": {"w": torch.zeros(4, 3).t()}}, {})
    with pytest.raises(ValueError, match="JSON"):
        store.save(1, {"block_0": {"w": torch.zeros(2)}}, {"t": torch.zeros(1)})
    with pytest.raises(ValueError, match="step"):
        store.save(-1, {"block_0": {"w": torch.zeros(2)}}, {})
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="--checkpoint-dir"):
        CheckpointStore(tmp_path / "file" / "sub")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_root(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="Permission denied"):
            CheckpointStore(root)
    finally:
        root.chmod(0o700)


@pytest.mark.parametrize("hard_link", [True, False])
def test_link_files(tmp_path, monkeypatch, hard_link):
    src = tmp_path / "nvme_tier.bin"
    src.write_bytes(os.urandom(300_000))
    if not hard_link:
        def refuse(*_args):
            raise OSError(errno.EXDEV, "cross-device link")
        monkeypatch.setattr(os, "link", refuse)
    store = CheckpointStore(tmp_path / "ckpt")
    info = store.save(1, make_groups(1), {}, link_files={"nvme_tier.bin": src})
    linked = info.path / "nvme_tier.bin"
    assert linked.read_bytes() == src.read_bytes()
    assert (linked.stat().st_ino == src.stat().st_ino) == hard_link
    assert info.total_bytes > 300_000
    store.verify(info)
    # editing the source in place shows through a hard link: verify catches it
    flip_byte(src, 5)
    if hard_link:
        with pytest.raises(CheckpointCorruptError, match=r"nvme_tier\.bin fails"):
            store.verify(info)
    else:
        store.verify(info)


def test_page_aligned_tensors_go_to_the_disk_direct_with_the_same_bytes(tmp_path, monkeypatch):
    from layerslide.training.checkpoint_snapshot import page_aligned_like
    if not cs.supports_direct(tmp_path):
        pytest.skip("this filesystem takes no O_DIRECT writes")
    values = {"w": torch.arange(5000.0), "b": torch.arange(7, dtype=torch.bfloat16),
              "empty": torch.zeros(0)}  # a whole-page tail, a part page, and an empty last one
    aligned = {}
    for name, t in values.items():
        aligned[name] = page_aligned_like(t)
        aligned[name].copy_(t)
    assert all(t.data_ptr() % cs.ALIGN == 0 for t in aligned.values())
    real_open, direct_opens = os.open, []

    def recording_open(path, flags, *args):
        if flags & os.O_DIRECT:
            direct_opens.append(Path(path).name)
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", recording_open)
    direct = CheckpointStore(tmp_path / "direct").save(1, {"block_0": aligned}, {})
    assert "block_0.bin" in direct_opens
    buffered = CheckpointStore(tmp_path / "buffered", direct_writes=False).save(
        1, {"block_0": dict(values)}, {})
    assert direct_opens.count("block_0.bin") == 1  # not for the store told not to
    read = lambda info: (info.path / "block_0.bin").read_bytes()
    assert read(direct) == read(buffered)
    into = {"block_0": {name: torch.empty_like(t) for name, t in values.items()}}
    CheckpointStore(tmp_path / "direct").load(direct, into)
    assert all(torch.equal(into["block_0"][n], values[n]) for n in values)


@pytest.mark.parametrize("refusal", ["einval", "short"])
def test_a_direct_write_refused_or_cut_short_goes_on_buffered(tmp_path, monkeypatch, refusal):
    from layerslide.training.checkpoint_snapshot import page_aligned_like
    values = torch.arange(3 * cs.ALIGN + 5, dtype=torch.float32)
    aligned = page_aligned_like(values)
    aligned.copy_(values)
    monkeypatch.setattr(cs, "supports_direct", lambda folder: True)
    real_open, real_pwrite, direct_fds = os.open, os.pwrite, set()

    def recording_open(path, flags, *args):
        fd = real_open(path, flags & ~os.O_DIRECT, *args)  # as if direct, on any filesystem
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def pwrite(fd, data, offset):
        if fd in direct_fds:
            if refusal == "einval" or len(data) < 2 * cs.ALIGN:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_pwrite(fd, data[:cs.ALIGN + 100], offset)  # short, off a page
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "pwrite", pwrite)
    store = CheckpointStore(tmp_path / "ckpt")
    info = store.save(1, {"block_0": {"w": aligned}}, {})
    assert direct_fds  # the direct path was taken, then left
    into = {"block_0": {"w": torch.empty_like(values)}}
    store.load(info, into)
    assert torch.equal(into["block_0"]["w"], values)
