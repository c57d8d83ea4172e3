"""Checkpoints of the full training state: a resumed run continues bit for bit on the CPU."""

from __future__ import annotations

import dataclasses
import re
import threading

import pytest
import torch
from helpers import SEQ, VOCAB, spec_of, tiny_config

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.checkpoint_store import CheckpointCorruptError, CheckpointStore
from layerslide.training.train_state import CheckpointSchedule
from layerslide.training.trainer import Trainer

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=2, decay_steps=6)


GPU = pytest.param("cuda", marks=pytest.mark.gpu)


def make_trainer(config, spec, train, policy, segment_steps=4, device="cpu"):
    return Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM, device=device,
                   segment_steps=segment_steps)


def final_state(trainer):
    weights = {n: v.clone() for n, v in trainer.state.named_master()}
    moments = {b: {name: t.clone() for name, t in m.tensors.items()}
               for b, m in trainer.state.moments.items()}
    return weights, moments


def assert_same_moments(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for block, tensors in expected.items():
        for name, value in tensors.items():
            assert torch.equal(got[block][name].cpu(), value), (block, name)


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize(("family", "tied", "accum", "clip", "policy"), [
    ("llama", False, 1, None, Policy.of()),
    ("qwen2", True, 2, 1.0, Policy.of(cpu_optimizer="torch")),
    ("llama", False, 2, None, Policy.of(gpu_updated_blocks=3)),
    ("qwen3", True, 1, 0.5, Policy.of(host_grad_buffers=2, cast="gpu")),
    ("qwen2", True, 3, 1.0, Policy.of(accumulation="layer_major")),
    ("llama", False, 2, None, Policy.of(accumulation="layer_major", gpu_updated_blocks=2)),
    ("llama", False, 2, 1.0, Policy.of(moment_precision="bf16", gpu_updated_blocks=2)),
    ("qwen2", True, 1, None, Policy.of(moment_precision="int8", accumulation="layer_major",
                                       gpu_updated_blocks=1)),
])
def test_resumed_run_matches_an_uninterrupted_one_bit_for_bit(tmp_path, device, family, tied,
                                                              accum, clip, policy):
    """Bit for bit on the CPU and, the kernels being deterministic for one shape, on CUDA."""
    config = tiny_config(family, tied)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=accum, max_grad_norm=clip)
    with make_trainer(config, spec, train, policy, device=device) as whole:
        whole.init_random(0)
        expected_logs = whole.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 6)
        expected = final_state(whole)

    store = CheckpointStore(tmp_path / "ckpt")
    with make_trainer(config, spec, train, policy, device=device) as first:  # "crashes" at 3
        first.init_random(0)
        first.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 3,
                  checkpoints=CheckpointSchedule(store=store, every_steps=3))
    # a fresh process: other segment boundaries, random weights that the restore replaces
    with make_trainer(config, spec, train, policy, segment_steps=2, device=device) as second:
        second.init_random(7)
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        info = second.checkpointing.restore_state(store, data)
        assert info.step == 3 and second.step == 3
        resumed_logs = second.fit(data, 3)
        got = final_state(second)

    assert [log.step for log in resumed_logs] == [3, 4, 5]
    assert [log.loss for log in resumed_logs] == [log.loss for log in expected_logs[3:]]
    assert [log.lr for log in resumed_logs] == [log.lr for log in expected_logs[3:]]
    for name, value in expected[0].items():
        assert torch.equal(got[0][name], value), name
    assert_same_moments(got[1], expected[1])


def test_schedule_saves_on_its_steps_and_at_the_end_and_keeps_the_newest(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2)
    seen = []
    with make_trainer(config, spec, TrainSpec(micro_batch=1, seq_len=SEQ), Policy.of(),
                      segment_steps=16) as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ), 5,
                           checkpoints=CheckpointSchedule(store=store, every_steps=2,
                                                          meta={"note": "x"}),
                           on_checkpoint=lambda info, _s: seen.append(info.step))
    assert len(logs) == 5
    assert seen == [2, 4, 5]
    assert [info.step for info in store.list()] == [4, 5]
    assert store.latest().meta["run"] == {"note": "x"}


@pytest.mark.parametrize("schedule", [
    (TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2),
     Policy.of(window=1, gpu_updated_blocks=2, accumulation="layer_major")),
    (TrainSpec(micro_batch=4, seq_len=SEQ, max_grad_norm=1.0),
     Policy.of(activations="gpu", cast="gpu", cpu_optimizer="torch")),
])
def test_restore_under_another_schedule_takes_the_state_as_it_was(tmp_path, schedule):
    """The state is per block: a run resumes under another micro-batch, accumulation, window,
    placement or kernel choice with the very weights, moments and step counts it saved."""
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    with make_trainer(config, spec, TrainSpec(micro_batch=1, seq_len=SEQ), Policy.of()) as first:
        first.init_random(0)
        first.fit(SyntheticTokens(VOCAB, SEQ), 2,
                  checkpoints=CheckpointSchedule(store=store, every_steps=2))
        saved = final_state(first)
    train, policy = schedule
    with make_trainer(config, spec, train, policy) as trainer:
        data = SyntheticTokens(VOCAB, SEQ)
        trainer.checkpointing.restore_state(store, data)
        trainer.runner.store_gpu_state()
        weights = {n: v.clone() for n, v in trainer.state.named_master()}
        assert all(torch.equal(weights[n], saved[0][n]) for n in saved[0])
        gpu = trainer.runner.gpu_blocks
        live = {b: (gpu.moments[b] if b in gpu else trainer.state.moments[b]).tensors
                for b in saved[1]}
        assert_same_moments(live, saved[1])
        assert trainer.step == 2 and data.windows_done == 2
        trainer.fit(data, 1)  # and trains on from there


@pytest.mark.parametrize(("policy", "optim", "words"), [
    (Policy.of(moments_on_nvme=0.5), OPTIM, "other NVMe state layout settings"),
    (Policy.of(), OptimConfig(lr=OPTIM.lr, beta1=0.8), "other optim settings"),
    (Policy.of(moment_precision="bf16"), OPTIM,
     r"other moment precision settings \(fp32\) than this run's \(bf16\)"),
])
def test_restore_refuses_a_checkpoint_whose_state_means_or_lies_otherwise(tmp_path, policy,
                                                                         optim, words):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    train = TrainSpec(micro_batch=1, seq_len=SEQ)
    with make_trainer(config, spec, train, Policy.of()) as trainer:
        trainer.init_random(0)
        trainer.checkpointing.save_state(store, SyntheticTokens(VOCAB, SEQ))
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=optim,
                 device="cpu", nvme_dir=tmp_path / "nvme") as trainer, \
            pytest.raises(ValueError, match=words):
        trainer.checkpointing.restore_state(store, SyntheticTokens(VOCAB, SEQ))


def test_a_longer_schedule_restores_the_state_and_decays_over_the_new_count(tmp_path):
    """The decay's length is the schedule, not what the state means: a resume with more
    --steps takes the checkpoint and runs the lr of the stretched cosine."""
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    train = TrainSpec(micro_batch=1, seq_len=SEQ)
    with make_trainer(config, spec, train, Policy.of()) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 4,
                    checkpoints=CheckpointSchedule(store=store, every_steps=4))
    longer = dataclasses.replace(OPTIM, decay_steps=OPTIM.decay_steps + 10)
    with Trainer(config=config, plan=build_plan(spec, train, Policy.of()), optim=longer,
                 device="cpu") as trainer:
        trainer.checkpointing.restore_state(store, SyntheticTokens(VOCAB, SEQ))
        (log,) = trainer.fit(SyntheticTokens(VOCAB, SEQ), 1)
    assert trainer.step == 5 and log.lr == longer.lr_at(4) > OPTIM.lr_at(4)


def test_corrupt_newest_checkpoint_is_refused_or_skipped_when_asked(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt", keep_last=3)
    train = TrainSpec(micro_batch=1, seq_len=SEQ)
    with make_trainer(config, spec, train, Policy.of()) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 2,
                    checkpoints=CheckpointSchedule(store=store, every_steps=1))
    newest = store.latest()
    victim = next(newest.path.glob("block_0.bin"))
    raw = bytearray(victim.read_bytes())
    raw[100] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with make_trainer(config, spec, train, Policy.of()) as trainer:
        with pytest.raises(CheckpointCorruptError, match="block_0"):
            trainer.checkpointing.restore_state(store, SyntheticTokens(VOCAB, SEQ))
        with pytest.warns(RuntimeWarning) as said:
            info = trainer.checkpointing.restore_state(store, SyntheticTokens(VOCAB, SEQ), fallback=True)
        assert info.step == 1 and trainer.step == 1
        messages = " | ".join(str(w.message) for w in said)
        assert re.search("skipping checkpoint .*step-000000002", messages)
        assert "set aside as damaged-step-000000002" in messages  # no longer the newest
        assert store.latest().step == 1


def test_a_checkpoint_from_before_a_policy_field_existed_still_matches_its_defaults():
    from layerslide.training.train_state import RUN_ONLY_POLICY_FIELDS, _with_defaults

    policy = Policy.of(window=4)
    computes = _with_defaults("policy", policy.to_dict())
    assert "executor" not in computes and "stream_run_ahead" not in computes["schedule"]
    assert set(RUN_ONLY_POLICY_FIELDS) == {"executor", "stream_run_ahead"}
    # a checkpoint from before the groups (and some fields) existed: flat, fields missing
    older = {k: v for k, v in policy.flat().items()
             if k not in ("gpu_updated_order", "head_chunk_bytes", "stream_run_ahead",
                          "cpu_threads", "cpu_chunk_elements", "lane_switch_interval_s")}
    assert _with_defaults("policy", older) == computes
    assert _with_defaults("policy", {**older, "window": 2}) != computes
    # how a run goes (its executor knobs, its run-ahead) does not stop it resuming
    assert _with_defaults("policy", policy.with_(stream_run_ahead=0, cpu_threads=4).to_dict()
                          ) == computes
    train = TrainSpec(micro_batch=1, seq_len=SEQ).to_dict()
    assert _with_defaults("train", train) == train
    assert _with_defaults("policy", {"no_such_field": 1}) == {"no_such_field": 1}


def checkpoint_bytes(path) -> dict[str, bytes]:
    """Every data file of a checkpoint (not its manifest, whose group order may differ)."""
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.name != "manifest.json"}


@pytest.mark.parametrize("policy", [
    Policy.of(), Policy.of(gpu_updated_blocks=2, accumulation="layer_major"),
    Policy.of(cpu_optimizer="torch", moment_precision="fp32"),
    Policy.of(moment_precision="int8", moments_on_nvme=0.5, master_on_nvme=0.5)])
def test_a_checkpoint_written_beside_training_is_the_synchronous_one(tmp_path, policy):
    """Written while the next steps run, a checkpoint holds the same bytes as one the pipeline
    waited for, and resumes to the same losses and state as an uninterrupted run."""
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    runs = {}
    for background in (False, True):
        store = CheckpointStore(tmp_path / f"ckpt-{background}", keep_last=5)
        stalls = []
        with Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM,
                     device="cpu", segment_steps=4,
                     nvme_dir=tmp_path / f"nvme-{background}") as trainer:
            trainer.init_random(0)
            assert trainer.checkpointing.checkpoint_copy_bytes == 0
            logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 6,
                               checkpoints=CheckpointSchedule(store=store, every_steps=2,
                                                              background=background),
                               on_checkpoint=lambda info, stall_s, seen=stalls: seen.append(
                                   (info.step, stall_s)))
            # fit made the copies' buffers ahead (and zeroed them) for checkpoints beside it
            assert (trainer.checkpointing.checkpoint_copy_bytes > 0) == background
            runs[background] = store, logs, final_state(trainer)
        assert [step for step, _ in stalls] == [2, 4, 6] and all(s >= 0 for _, s in stalls)
    (sync_store, sync_logs, _), (store, logs, state) = runs[False], runs[True]
    assert [log.loss for log in logs] == [log.loss for log in sync_logs]
    for ours, theirs in zip(store.list(), sync_store.list(), strict=True):
        assert checkpoint_bytes(ours.path) == checkpoint_bytes(theirs.path), ours.step
    newest = store.latest().path
    newest.rename(tmp_path / "set-aside")  # resume from the one of step 4, written beside
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM, device="cpu",
                 segment_steps=2, nvme_dir=tmp_path / "nvme-resumed") as resumed:
        resumed.init_random(5)
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        assert resumed.checkpointing.restore_state(store, data).step == 4
        tail = resumed.fit(data, 2)
        got = final_state(resumed)
    assert [log.loss for log in tail] == [log.loss for log in logs[4:]]
    for name, value in state[0].items():
        assert torch.equal(got[0][name], value), name
    assert_same_moments(got[1], state[1])


def test_a_checkpoint_beside_training_links_the_nvme_files_of_its_own_step(tmp_path,
                                                                           monkeypatch):
    """Its writer links the state files only once the next step has replaced them: the
    checkpoint still holds its step's files (linked as the pipeline drained), as the
    synchronous one does."""
    from layerslide.training import checkpoint_store

    config, policy = tiny_config("llama"), Policy.of(moments_on_nvme=0.5, master_on_nvme=0.5)
    plan = build_plan(spec_of(config, tmp_path), TrainSpec(micro_batch=2, seq_len=SEQ), policy)
    next_step_done, link = threading.Event(), checkpoint_store._link

    def late_link(*args):
        next_step_done.wait(30)
        return link(*args)

    stores = {}
    for background in (False, True):
        stores[background] = store = CheckpointStore(tmp_path / f"ckpt-{background}")
        monkeypatch.setattr(checkpoint_store, "_link", late_link if background else link)
        with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu", segment_steps=2,
                     nvme_dir=tmp_path / f"nvme-{background}") as trainer:
            trainer.init_random(0)
            trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 4,
                        checkpoints=CheckpointSchedule(store=store, every_steps=2,
                                                       background=background),
                        on_step_done=lambda step: step == 3 and next_step_done.set())
    assert next_step_done.is_set()
    ours, theirs = (stores[b].list()[0] for b in (True, False))
    assert ours.step == theirs.step == 2
    assert checkpoint_bytes(ours.path) == checkpoint_bytes(theirs.path)
    assert not list((tmp_path / "nvme-True").glob("*.pinned"))  # the pins went with it
