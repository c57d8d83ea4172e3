"""The copy-on-write guard between a checkpoint's writer and the updates that go on meanwhile."""

from __future__ import annotations

import threading

import pytest
import torch

from layerslide.training.checkpoint_snapshot import CheckpointSnapshot, SnapshotGuard
from layerslide.training.checkpoint_store import CheckpointStore


def two_groups():
    return {"block_1": {"master": torch.arange(4.0)}, "block_0": {"master": torch.ones(4)}}


def test_an_update_copies_a_pending_block_within_the_budget_and_waits_beyond_it():
    groups = two_groups()
    guard = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=16)
    guard.before_update(1)  # pending, 16 bytes fit: copied
    groups["block_1"]["master"].add_(100)  # the update changes the live tensor
    assert guard.copied_bytes == 16
    assert torch.equal(guard.claim("block_1", groups["block_1"])["master"], torch.arange(4.0))
    waiting = threading.Thread(target=guard.before_update, args=(0,))
    waiting.start()  # block_0 does not fit the budget (block_1's copy holds it): waits
    waiting.join(0.2)
    assert waiting.is_alive()
    assert guard.claim("block_0", groups["block_0"]) is groups["block_0"]  # its live tensors
    waiting.join(0.2)
    assert waiting.is_alive()  # still being written
    guard.release("block_0")
    waiting.join(5)
    assert not waiting.is_alive() and guard.stall_s >= 0.2
    guard.release("block_1")
    guard.before_update(1)  # written: nothing to wait for
    guard.before_update(7)  # not a block of this checkpoint (e.g. updated on the GPU)


def test_a_failed_write_lets_every_waiting_update_go():
    groups = two_groups()
    guard = SnapshotGuard(groups, {0: "block_0"}, copy_budget_bytes=0)
    waiting = threading.Thread(target=guard.before_update, args=(0,))
    waiting.start()
    waiting.join(0.1)
    assert waiting.is_alive()
    guard.release_all()
    waiting.join(5)
    assert not waiting.is_alive()


def test_the_copier_copies_ahead_in_order_what_fits_and_skips_what_does_not():
    groups = {"block_2": {"master": torch.arange(8.0)}, "block_1": {"master": torch.zeros(64)},
              "block_0": {"master": torch.ones(4)}}
    guard = SnapshotGuard(groups, {2: "block_2", 1: "block_1", 0: "block_0"},
                          copy_budget_bytes=48)  # block_2 (32 B) and block_0 (16 B) fit
    guard.start_copying().join(5)
    assert guard.copied_bytes == 48
    groups["block_2"]["master"].add_(1)
    assert torch.equal(guard.claim("block_2", groups["block_2"])["master"], torch.arange(8.0))
    assert guard.claim("block_1", groups["block_1"]) is groups["block_1"]  # live: too big
    guard.before_update(0)  # copied ahead: no wait
    assert guard.stall_s < 0.5


def test_a_copy_that_fails_leaves_the_group_to_the_writer_and_the_update_raises(monkeypatch):
    from layerslide.training import checkpoint_snapshot

    def broken(src, dst, pool):
        raise MemoryError("no room")
    monkeypatch.setattr(checkpoint_snapshot, "_parallel_copy", broken)
    monkeypatch.setattr(checkpoint_snapshot, "_copy_whole", lambda src, dst: broken(src, dst, None))
    groups = two_groups()
    guard = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=64)
    guard.start_copying().join(5)  # the copier stops at its first failure
    claimed = []
    writer = threading.Thread(target=lambda: claimed.append(guard.claim("block_1",
                                                                        groups["block_1"])))
    writer.start()
    writer.join(5)
    assert not writer.is_alive() and claimed[0] is groups["block_1"]  # not hung: live tensors
    with pytest.raises(MemoryError):
        guard.before_update(0)  # its own copy fails: the update says so
    guard.release("block_1")
    assert guard.claim("block_0", groups["block_0"]) is groups["block_0"]  # budget given back
    assert guard.copied_bytes == 0


def test_a_parallel_copy_of_a_strided_tensor_holds_its_values():
    from concurrent.futures import ThreadPoolExecutor

    from layerslide.training import checkpoint_snapshot
    tensor = torch.arange(12.0).reshape(3, 4).t()
    copy = torch.empty(4, 3)
    with ThreadPoolExecutor(2) as pool:
        checkpoint_snapshot._parallel_copy(tensor, copy, pool)
    assert torch.equal(copy, tensor)


def test_the_writer_copies_a_group_before_writing_it_so_its_update_need_not_wait():
    groups = two_groups()
    guard = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=32)
    written = guard.claim("block_1", groups["block_1"])  # being written, from a copy
    assert written is not groups["block_1"] and torch.equal(written["master"], torch.arange(4.0))
    guard.before_update(1)  # returns at once: the write reads the copy
    groups["block_1"]["master"].add_(100)
    assert torch.equal(written["master"], torch.arange(4.0))
    guard.release("block_1")


def test_copies_are_kept_for_the_next_checkpoint_and_copy_outside_its_budget():
    groups, kept = two_groups(), {}
    first = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=16, kept=kept)
    first.before_update(1)  # copied within the budget (16 B): block_0 does not fit beside it
    first.claim("block_1", groups["block_1"])
    first.release("block_1")
    assert set(kept) == {"block_1"}
    buffer = kept["block_1"]["master"]
    groups["block_1"]["master"].add_(1)  # the state the next checkpoint holds
    second = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=0, kept=kept)
    second.before_update(1)  # no budget, but its kept buffer: copied, into the same memory
    assert second.copied_bytes == 16
    copy = second.claim("block_1", groups["block_1"])["master"]
    assert copy.data_ptr() == buffer.data_ptr() and torch.equal(copy, torch.arange(4.0) + 1)
    assert second.claim("block_0", groups["block_0"]) is groups["block_0"]  # none kept: live


def test_copy_buffers_are_made_ahead_in_order_within_the_budget_and_touched():
    from layerslide.training.checkpoint_snapshot import keep_copy_buffers
    groups = {"block_2": {"master": torch.ones(8), "exp_avg": torch.ones(8)},
              "block_1": {"master": torch.ones(64)}, "block_0": {"master": torch.ones(4)}}
    kept = {}
    held = keep_copy_buffers(groups, 80, kept, threads=2)  # block_1 (256 B) is over
    assert held == 80 and set(kept) == {"block_2", "block_0"}
    assert all(torch.count_nonzero(t) == 0 for ts in kept.values() for t in ts.values())
    assert kept["block_2"]["exp_avg"].shape == (8,)
    assert keep_copy_buffers(groups, 0, kept) == 80  # kept ones stay, none added


def test_a_snapshot_writes_a_loadable_checkpoint_and_raises_what_its_write_raised(tmp_path):
    groups = two_groups()
    store = CheckpointStore(tmp_path / "ckpt")
    guard = SnapshotGuard(groups, {1: "block_1", 0: "block_0"}, copy_budget_bytes=1 << 20)
    snapshot = CheckpointSnapshot(store, 3, groups, {"note": 1}, link_files={}, guard=guard)
    guard.before_update(0)  # copied or already written: the checkpoint keeps the old values
    groups["block_0"]["master"].zero_()
    info = snapshot.wait()
    into = {g: {n: torch.empty_like(t) for n, t in ts.items()} for g, ts in groups.items()}
    assert store.load(info, into) == {"note": 1}
    assert torch.equal(into["block_0"]["master"], torch.ones(4)) and snapshot.done()

    failing = CheckpointSnapshot(store, 4, groups, {"bad": object()}, link_files={},
                                 guard=SnapshotGuard(groups, {0: "block_0"}, 0))
    with pytest.raises(ValueError, match="JSON"):
        failing.wait()
    failing.guard.before_update(0)  # released: does not hang
