"""Checkpoints of several ranks (training/rank_checkpoints.py): each writes its slices, and a
run resumes on the same count of ranks bit for bit, and on another count or on one rank with
the state bit for bit as saved (the training after it within test_trainer's tolerances: the
ranks' grads are summed in another order)."""

from __future__ import annotations

import pytest
import torch
from helpers import SEQ, VOCAB, tiny_config
from ranks_harness import OPTIM, TrainJob, checkpointed, make_plan, spawn

from layerslide.data.sources import SyntheticTokens
from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS
from layerslide.planner.sharding import Shards
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.rank_checkpoints import (
    RANK_FOLDER,
    layout_meta,
    reslice,
    saved_steps,
)
from layerslide.training.trainer import Trainer

POLICY = {"accumulation": "layer_major", "moment_precision": "int8"}


def whole(results: list[dict], part: str, block: int, name: str | None, count: int):
    """The block's tensor from every rank's slice of it (a result's part: saved/restored)."""
    slices = [r[part]["owned"][block] if name is None else r[part]["moments"][block][name]
              for r in results]
    joined = torch.cat(slices)
    assert torch.count_nonzero(joined[count:]) == 0  # padding past the block: zeros
    return joined[:count]


def counts(numel: int, name: str | None) -> int:
    scales = name is not None and name.endswith("_scale")
    return -(-numel // MOMENT_BLOCK_ELEMENTS) if scales else numel


def check_same_state(saved: list[dict], restored: list[dict], part: str, numels: dict) -> None:
    for b, numel in numels.items():
        for name in (None, *saved[0]["saved"]["moments"][b]):
            n = counts(numel, name)
            assert torch.equal(whole(restored, part, b, name, n),
                               whole(saved, "saved", b, name, n)), (b, name)


def test_two_ranks_resume_on_two_bit_for_bit_and_on_four_and_one_as_saved(tmp_path):
    config = tiny_config("llama")
    root = str(tmp_path / "checkpoints")
    _, two_plan = make_plan(tmp_path, "two", config, accum=2, gpus=2, **POLICY)
    job = TrainJob(out=str(tmp_path / "two-out"), plan=two_plan, config=config, optim=OPTIM,
                   steps=2, options={"root": root, "first": 2})
    two = spawn(checkpointed, job, gpus=2)
    numels = {b: len(t) for b, t in _numels(config).items()}
    for r in two:  # the same count of ranks: the run goes on as if never stopped
        assert r["resumed"]["step"] == 2 and r["resumed"]["losses"] == r["uninterrupted"]["losses"]
        for name, value in r["uninterrupted"]["final"].items():
            assert torch.equal(r["resumed"]["final"][name], value), name
    check_same_state(two, [r["resumed"] for r in two], "restored", numels)
    assert (tmp_path / "checkpoints" / RANK_FOLDER.format(1)).is_dir()

    _, four_plan = make_plan(tmp_path, "four", config, accum=1, gpus=4, **POLICY)
    four = spawn(checkpointed, TrainJob(out=str(tmp_path / "four-out"), plan=four_plan,
                                        config=config, optim=OPTIM, steps=2,
                                        options={"root": root, "resume": True}), gpus=4)
    check_same_state(two, four, "restored", numels)
    for r in four:
        assert r["restored"]["steps_taken"] == two[0]["saved"]["steps_taken"]
        check_close(r["losses"], r["final"], two[0])

    one_plan, _ = make_plan(tmp_path, "one", config, accum=4, **POLICY)
    with Trainer(config=config, plan=one_plan, optim=OPTIM, device="cpu") as trainer:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        assert trainer.checkpointing.restore_state(CheckpointStore(root), data).step == 2
        one = {"owned": {b: trainer.state.owned_master(b).clone() for b in numels},
               "moments": {b: dict(trainer.state.moments[b].tensors) for b in numels}}
        check_same_state(two, [{"restored": one}], "restored", numels)
        logs = trainer.fit(data, 2)
        check_close([log.loss for log in logs], dict(trainer.state.named_master()), two[0])


def check_close(losses: list[float], final: dict, original: dict) -> None:
    """Trained on from the same state on another count of ranks: test_trainer's tolerances
    against the uninterrupted run (the weights' distance under a tenth of their update)."""
    ran, start = original["uninterrupted"], original["saved"]["named"]
    assert losses == pytest.approx(ran["losses"], rel=1e-3)
    update = torch.cat([(ran["final"][n] - start[n]).flatten() for n in start])
    diff = torch.cat([(final[n] - ran["final"][n]).flatten() for n in start])
    assert update.norm() > 0 and diff.norm() / update.norm() < 0.1


def _numels(config) -> dict:
    from layerslide.executor.blocks import ModelBlocks

    blocks = ModelBlocks(config)
    return {b: range(blocks.numel(b)) for b in blocks.blocks}


@pytest.mark.parametrize(("saved_ranks", "ranks"), [(1, 3), (2, 3), (3, 1), (4, 2)])
def test_slices_are_cut_from_the_saved_ones_bit_for_bit(tmp_path, saved_ranks, ranks):
    """Elements and the 8-bit scales (one per 2048 elements) of a block land where they
    belong whatever the counts of ranks that wrote and read them."""
    numel = 5 * MOMENT_BLOCK_ELEMENTS + 77
    values = torch.randn(numel)
    codes = torch.randint(1, 255, (numel,), dtype=torch.uint8)
    scales = torch.rand(-(-numel // MOMENT_BLOCK_ELEMENTS))
    store = CheckpointStore(tmp_path / "c")
    saved = Shards(numel, saved_ranks)
    for r in range(saved_ranks):
        part = _slice_of({"master": values, "exp_avg": codes, "exp_avg_scale": scales},
                         saved, r)
        meta = {"ranks": layout_meta(_Place(r, saved_ranks), {0: saved})}
        target = store if saved_ranks == 1 else CheckpointStore(
            store.root / RANK_FOLDER.format(r))
        target.save(3, {"block_0": part}, meta if saved_ranks > 1 else {})
    found = saved_steps(store)[0]
    assert (found.step, found.gpus) == (3, saved_ranks)
    mine = Shards(numel, ranks)
    for r in range(ranks):
        into = {"block_0": {"master": torch.full((mine.slice_numel,), 9.0),
                            "exp_avg": torch.empty(mine.slice_numel, dtype=torch.uint8),
                            "exp_avg_scale": torch.empty(-(-mine.slice_numel
                                                           // MOMENT_BLOCK_ELEMENTS))}}
        reslice(found, into, {0: mine}, r)
        expected = _slice_of({"master": values, "exp_avg": codes, "exp_avg_scale": scales},
                             mine, r)
        for name, tensor in expected.items():
            assert torch.equal(into["block_0"][name], tensor), (r, name)


class _Place:
    """A rank's place as layout_meta reads it (no process group needed)."""

    def __init__(self, rank: int, gpus: int):
        self.gpus, self.hosts, self.local_rank = gpus, 1, rank


def _slice_of(tensors: dict, shards: Shards, rank: int) -> dict:
    """Rank's slice of each whole tensor, zero-padded (scales: per 2048 elements)."""
    out = {}
    for name, tensor in tensors.items():
        per = MOMENT_BLOCK_ELEMENTS if name.endswith("_scale") else 1
        start, size = shards.start(rank) // per, -(-shards.slice_numel // per)
        part = torch.zeros(size, dtype=tensor.dtype)
        piece = tensor[start:start + size]
        part[:piece.numel()] = piece
        out[name] = part
    return out


NVME = {**POLICY, "master_on_nvme": 0.5, "moments_on_nvme": 0.75}


def one_rank_resumed(config, plan, root, nvme_dir=None) -> dict:
    """One rank's restored state (its whole blocks) and two steps trained on from it."""
    from ranks_harness import _state_of

    with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu", segment_steps=2,
                 nvme_dir=nvme_dir) as trainer:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        assert trainer.checkpointing.restore_state(CheckpointStore(root), data).step == 2
        restored = _state_of(trainer)
        logs = trainer.fit(data, 2)
        return {"restored": restored, "losses": [log.loss for log in logs],
                "final": {n: v.clone() for n, v in trainer.state.named_master()}}


def test_state_on_nvme_resumes_from_two_ranks_on_one_and_from_one_on_two(tmp_path):
    """Each rank's NVMe part is cut out of the saved slices and written to its own files: the
    state as saved bit for bit, trained on as the same state read whole, and back on two ranks
    as the two that saved it, never stopped."""
    config = tiny_config("llama")
    root = str(tmp_path / "two-ckpt")
    _, two_plan = make_plan(tmp_path, "two", config, accum=2, gpus=2, **NVME)
    two = spawn(checkpointed, TrainJob(out=str(tmp_path / "two-out"), plan=two_plan,
                                       config=config, optim=OPTIM, steps=2,
                                       nvme_dir=str(tmp_path / "two-nvme"),
                                       options={"root": root, "first": 2}), gpus=2)
    numels = {b: len(t) for b, t in _numels(config).items()}
    one_plan, _ = make_plan(tmp_path, "one", config, accum=4, **NVME)
    on_disk = one_rank_resumed(config, one_plan, root, tmp_path / "one-nvme")
    check_same_state(two, [on_disk], "restored", numels)
    check_close(on_disk["losses"], on_disk["final"], two[0])

    one_root = str(tmp_path / "one-ckpt")  # the same state as one rank's checkpoint
    with Trainer(config=config, plan=one_plan, optim=OPTIM, device="cpu",
                 nvme_dir=tmp_path / "one-nvme") as trainer:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        trainer.checkpointing.restore_state(CheckpointStore(root), data)
        trainer.checkpointing.save_state(CheckpointStore(one_root), data)
    linked = one_rank_resumed(config, one_plan, one_root, tmp_path / "linked-nvme")
    assert linked["losses"] == on_disk["losses"]  # cut from slices = linked whole: bit for bit
    assert all(torch.equal(linked["final"][n], v) for n, v in on_disk["final"].items())
    # and back on two ranks: as the two that saved it trained on, never stopped
    again = spawn(checkpointed, TrainJob(out=str(tmp_path / "again-out"), plan=two_plan,
                                         config=config, optim=OPTIM, steps=2,
                                         nvme_dir=str(tmp_path / "again-nvme"),
                                         options={"root": one_root, "resume": True}), gpus=2)
    check_same_state(two, again, "restored", numels)
    for r in again:
        assert r["losses"] == two[0]["resumed"]["losses"]  # as the two ranks that saved it
        assert all(torch.equal(r["final"][n], v) for n, v in two[0]["resumed"]["final"].items())
