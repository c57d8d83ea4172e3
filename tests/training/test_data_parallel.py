"""Data-parallel sliding windows with the host state sharded by owner (issue 53), on the CPU:
ranks are processes on this machine meeting through gloo (tests/ranks_harness.py).

N ranks each accumulating A micro-batches train as one rank accumulating N x A of the same
global order: the same losses and final weights within test_trainer's tolerances against its
reference (losses rel 1e-3, the weights' distance under a tenth of the update; grad norms rel
1e-2). They are not bit-equal: the ranks' bf16 grads are summed in bf16 by the reduce-scatter
where one rank sums its micro-batches' grads in fp32. Equal bit for bit: the initial weights on
any rank count, and a state partly on NVMe (a folder per rank) against the same all in RAM.
"""

from __future__ import annotations

import pytest
import torch
from helpers import SEQ, VOCAB, tiny_config
from ranks_harness import OPTIM, TrainJob, eval_batches, make_plan, spawn, train

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.planner.plan import HOST_MASTER, HOST_MOMENTS, HOST_UPLOAD
from layerslide.planner.sharding import SHARD_ALIGN
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.hf_io import iter_checkpoint_tensors
from layerslide.training.rank_checkpoints import saved_steps
from layerslide.training.trainer import Trainer

STEPS = 3
EVAL_BATCHES = 3  # fewer than 4 ranks: one scores none
# bytes per element of each part of a block's state (fp32 moments: m and v)
STATE_RATES = {HOST_MASTER: 4, HOST_UPLOAD: 2}


def one_rank(config, plan) -> dict:
    """The same training in this process, as one rank accumulating the global batch."""
    with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu",
                 segment_steps=3) as trainer:
        trainer.init_random(0)
        initial = {n: v.clone() for n, v in trainer.state.named_master()}
        scored = trainer.evaluate(eval_batches(EVAL_BATCHES))
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), STEPS)
        return {"losses": [log.loss for log in logs], "eval": scored,
                "grad_norms": [log.grad_norm for log in logs],
                "tokens_per_step": [log.tokens_per_s * log.step_s for log in logs],
                "initial": initial,
                "final": {n: v.clone() for n, v in trainer.state.named_master()},
                "numel": {b: trainer.blocks.numel(b) for b in trainer.blocks.blocks},
                "allocated": trainer.allocated_bytes()}


def run_ranks(tmp_path, config, *, gpus, hosts=1, accum, nvme=False, save=False, name="many",
              options=None, steps=STEPS, **policy) -> list[dict]:
    _, path = make_plan(tmp_path, name, config, accum=accum, gpus=gpus, hosts=hosts, **policy)
    job = TrainJob(out=str(tmp_path / f"{name}-out"), plan=path, config=config, optim=OPTIM,
                   steps=steps, nvme_dir=str(tmp_path / f"{name}-nvme") if nvme else None,
                   save_to=str(tmp_path / "saved") if save else None,
                   options={"eval_batches": EVAL_BATCHES, **(options or {})})
    return spawn(train, job, gpus=gpus, hosts=hosts)


def ranks_against_one(tmp_path, config, *, gpus, hosts=1, accum, options=None, steps=STEPS,
                      **policy):
    """gpus x hosts ranks of `accum` micro-batches against one rank of all of theirs (STEPS
    steps: the ranks' run may be longer and stop there)."""
    ranks = run_ranks(tmp_path, config, gpus=gpus, hosts=hosts, accum=accum, options=options,
                      steps=steps, **policy)
    one_plan, _ = make_plan(tmp_path, "one", config, accum=accum * gpus * hosts, **policy)
    one = one_rank(config, one_plan)
    check_same_training(one, ranks)
    return one, ranks


def check_same_training(one: dict, ranks: list[dict]) -> None:
    update = torch.cat([(one["final"][n] - one["initial"][n]).flatten() for n in one["initial"]])
    assert update.norm() > 0
    for result in ranks:
        for name, value in one["initial"].items():  # each rank's slices of the same draws
            assert torch.equal(result["initial"][name], value), name
        assert result["losses"] == pytest.approx(one["losses"], rel=1e-3)
        assert result["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-2)
        assert result["tokens_per_step"] == pytest.approx(one["tokens_per_step"])  # global
        diff = torch.cat([(result["final"][n] - one["final"][n]).flatten()
                          for n in one["initial"]])
        assert diff.norm() / update.norm() < 0.1
        assert result["allocated"] == result["expected"]  # each rank's ledger holds
        # the eval of the same weights: each rank scored its share of the batches
        assert (result["eval"].accuracy, result["eval"].tokens) == (
            one["eval"].accuracy, one["eval"].tokens)
        assert result["eval"].loss == pytest.approx(one["eval"].loss, rel=1e-9)
    assert all(r["losses"] == ranks[0]["losses"] for r in ranks)  # the global loss, everywhere


def check_one_copy(one: dict, host: list[dict], moment_bytes: float) -> None:
    """A host's ranks together hold one copy of every block's state: their slices side by side
    are the block (zeros past its end), and what they allocated (the ledger's bytes) adds up
    to one copy plus that padding."""
    padding = 0
    for b, numel in one["numel"].items():
        whole = torch.cat([r["owned"][b] for r in host])
        assert torch.equal(whole[:numel], host[0]["whole"][b]), b
        assert torch.count_nonzero(whole[numel:]) == 0, b
        padding += whole.numel() - numel
    assert 0 <= padding < len(host) * SHARD_ALIGN * len(one["numel"])
    for key, rate in {**STATE_RATES, HOST_MOMENTS: moment_bytes}.items():
        summed = sum(r["allocated"].get(key, 0) for r in host)
        one_copy = one["allocated"].get(key)  # None: the policy keeps no such part
        assert summed == (0 if one_copy is None else one_copy + rate * padding), key


def test_two_ranks_step_major_train_as_one_rank_accumulating_their_batch(tmp_path):
    """Each load's slice cast on the CPU per load, grads landing in a pool of one buffer."""
    config = tiny_config("llama")
    one, ranks = ranks_against_one(tmp_path, config, gpus=2, accum=2, cast="cpu_per_load",
                                   host_grad_buffers=1)
    check_one_copy(one, ranks, moment_bytes=8)


def test_four_ranks_layer_major_with_bf16_moments(tmp_path):
    config = tiny_config("qwen2", tied=True)
    one, ranks = ranks_against_one(tmp_path, config, gpus=4, accum=1,
                                   accumulation="layer_major", moment_precision="bf16")
    check_one_copy(one, ranks, moment_bytes=4)


def test_two_ranks_load_a_hugging_face_folder_and_save_one(tmp_path):
    config = tiny_config("llama")
    plan, _ = make_plan(tmp_path, "one", config, accum=1)
    with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu") as trainer:
        trainer.init_random(5)
        start = trainer.save(tmp_path / "start")
    ranks = run_ranks(tmp_path, config, gpus=2, accum=1, save=True,
                      options={"load_from": str(start), "save_again": True})
    # saved again over it without overwrite: rank 0 refuses, the other's gathers still end
    assert "exists" in ranks[0]["refused"] and ranks[1]["refused"] is None
    loaded = dict(iter_checkpoint_tensors(start))
    for result in ranks:  # every rank's slices of the folder's weights
        for name, value in loaded.items():
            assert torch.equal(result["initial"][name], value.float()), name
    assert ranks[0]["saved"] is not None and ranks[1]["saved"] is None  # rank 0 alone writes
    saved = dict(iter_checkpoint_tensors(ranks[0]["saved"]))
    assert set(saved) == set(ranks[0]["final"])
    for name, value in ranks[0]["final"].items():
        assert torch.equal(saved[name], value.to(torch.bfloat16)), name


def test_int8_state_on_nvme_in_a_folder_per_rank_equals_it_in_ram(tmp_path):
    config = tiny_config("llama")
    policy = {"moment_precision": "int8", "accumulation": "layer_major"}
    in_ram = run_ranks(tmp_path, config, gpus=2, accum=2, name="ram", **policy)
    on_nvme = run_ranks(tmp_path, config, gpus=2, accum=2, name="nvme", nvme=True,
                        master_on_nvme=0.5, moments_on_nvme=0.75, **policy)
    for rank, (ram, nvme) in enumerate(zip(in_ram, on_nvme, strict=True)):
        assert ram["losses"] == nvme["losses"]
        assert nvme["allocated"] == nvme["expected"]
        for b, owned in ram["owned"].items():
            assert torch.equal(nvme["owned"][b], owned), (rank, b)
            for name, tensor in ram["moments"][b].items():
                assert torch.equal(nvme["moments"][b][name], tensor), (rank, b, name)
        assert any((tmp_path / "nvme-nvme" / f"rank{rank}").iterdir())  # its own folder
    one = one_rank(config, make_plan(tmp_path, "one", config, accum=4, **policy)[0])
    check_same_training(one, in_ram)


def test_two_hosts_of_one_rank_sum_their_grads_across_the_network_and_stop_together(tmp_path):
    """One rank's stop event ends every rank's run where the segment (3 steps) ends, and the
    checkpoint there is written (by the first host)."""
    root = tmp_path / "checkpoints"
    _, ranks = ranks_against_one(tmp_path, tiny_config("llama"), gpus=1, hosts=2, accum=2,
                                 steps=2 * STEPS, options={"stop_on": 1, "root": str(root)})
    assert all(r["stopped"] and len(r["losses"]) == STEPS for r in ranks)
    assert [p.name for p in root.iterdir()] == ["rank-00000"]
    assert saved_steps(CheckpointStore(root))[0].step == STEPS


def test_two_hosts_of_two_ranks_shard_inside_and_replicate_across(tmp_path):
    root = tmp_path / "checkpoints"
    one, ranks = ranks_against_one(tmp_path, tiny_config("llama"), gpus=2, hosts=2, accum=1,
                                   accumulation="layer_major", cast="gpu",  # fp32 gathered
                                   options={"root": str(root)})
    # the first host's ranks write the state's checkpoint, a slice each; the others hold it too
    assert sorted(p.name for p in root.iterdir()) == ["rank-00000", "rank-00001"]
    assert saved_steps(CheckpointStore(root))[0].step == STEPS
    for host in (ranks[:2], ranks[2:]):
        check_one_copy(one, host, moment_bytes=8)
    for first, second in zip(ranks[:2], ranks[2:], strict=True):  # each host a whole copy
        for b, owned in first["owned"].items():
            assert torch.equal(second["owned"][b], owned), b


def test_a_plan_for_other_ranks_is_refused_before_anything_is_allocated(tmp_path):
    config = tiny_config("llama")
    plan, _ = make_plan(tmp_path, "two", config, accum=1, gpus=2)
    with pytest.raises(ValueError, match="plan is for 2 GPU"):
        Trainer(config=config, plan=plan, optim=OPTIM, device="cpu", ranks=SINGLE)


def test_each_rank_takes_its_share_of_one_global_order(tmp_path):
    """Rank r of N, accumulating A, takes micro-batches r*A..(r+1)*A-1 of each step's N*A."""
    config = tiny_config("llama")
    plan, _ = make_plan(tmp_path, "two", config, accum=2, gpus=2)
    order = SyntheticTokens(VOCAB, SEQ, seed=1)
    stream = [order.next_batch(2)[0] for _ in range(8)]
    with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu",
                 ranks=Ranks(rank=1, gpus=2)) as trainer:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        steps = [trainer._step_batches(data, s) for s in range(2)]
        assert data.state_dict() == order.state_dict()  # every batch of both steps read
    for s, mine in enumerate(steps):
        assert sorted(mine) == [(s, 0), (s, 1)]
        for m in range(2):
            assert torch.equal(mine[(s, m)][0], stream[4 * s + 2 + m])


def test_each_rank_of_a_host_takes_its_share_of_the_cores_for_adamw(monkeypatch):
    from layerslide.executor import host_state

    monkeypatch.setattr(host_state.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert [host_state.cpu_threads(0, ranks) for ranks in (1, 2, 4, 32)] == [0, 8, 4, 1]
    assert host_state.cpu_threads(3, 4) == 3  # as the plan's executor settings ask
