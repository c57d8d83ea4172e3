"""The NVMe tier for master weights and AdamW moments: the same training as with all state in
RAM, bit for bit;
staging buffers reused only where the plan's edges make it safe; refusals and a full disk."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest
import torch
from helpers import SEQ, VOCAB, spec_of, tiny_config
from safetensors.torch import load_file

from layerslide.data.sources import SyntheticTokens
from layerslide.executor import nvme as nvme_module
from layerslide.executor.engine import TaskFailedError
from layerslide.executor.optim import OptimConfig
from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.checkpoint_store import CheckpointStore
from layerslide.training.train_state import CheckpointSchedule
from layerslide.training.trainer import Trainer

OPTIM = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=1)


GPU = pytest.param("cuda", marks=pytest.mark.gpu)


def train_run(tmp_path, policy, train, *, steps=3, serial=False, family="llama", tied=False,
              device="cpu"):
    config = tiny_config(family, tied)
    spec = spec_of(config, tmp_path)
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM, device=device,
                 serial=serial, nvme_dir=tmp_path / "nvme") as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), steps)
        activation_files = sorted(p.name for p in (tmp_path / "nvme").glob("activations_*"))
        weights = {n: v.clone() for n, v in trainer.state.named_master()}
        moments = {}
        for b, ram in trainer.state.moments.items():
            parts = [ram]
            if trainer.state.disk_moments[b]:
                parts.insert(0, trainer.state.nvme.read_block(b)[1])
            moments[b] = {name: torch.cat([part.tensors[name] for part in parts])
                          for name in ram.tensors}
    return [log.loss for log in logs], weights, moments, activation_files


def assert_same_moments(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for block, tensors in expected.items():
        for name, value in tensors.items():
            assert torch.equal(got[block][name], value), (block, name)


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize(("precision", "master", "moments", "weights", "accumulation"), [
    ("bf16", 0.5, 0.5, 0.0, "step_major"), ("int8", 0.3, 0.6, 0.5, "step_major"),
    ("int8", 1.0, 1.0, 1.0, "layer_major"), ("bf16", 0.0, 0.7, 0.4, "layer_major")])
def test_compact_moments_on_nvme_train_exactly_as_in_ram(tmp_path, serial, precision, master,
                                                        moments, weights, accumulation):
    """The disk holds the compact moments as RAM does (8-bit: codes and scales, cut at whole
    scale blocks), and a run is the all-in-RAM run bit for bit, serial or overlapped."""
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2, max_grad_norm=1.0)
    base = {"moment_precision": precision, "accumulation": accumulation}
    in_ram = train_run(tmp_path / "ram", Policy.of(**base), train)
    policy = Policy.of(**base, master_on_nvme=master, moments_on_nvme=moments,
                       weights_on_nvme=weights)
    on_disk = train_run(tmp_path / "disk", policy, train, serial=serial)
    assert on_disk[0] == in_ram[0]
    for name, value in in_ram[1].items():
        assert torch.equal(on_disk[1][name], value), name
    assert_same_moments(on_disk[2], in_ram[2])
    if precision == "int8":
        assert set(next(iter(in_ram[2].values()))) == {"exp_avg", "exp_avg_sq", "exp_avg_scale",
                                                       "exp_avg_sq_scale"}


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize(("master", "moments", "accum", "clip", "family", "tied"), [
    (0.0, 1.0, 1, None, "llama", False), (0.0, 0.5, 2, 1.0, "qwen2", True),
    (0.0, 0.3, 1, 0.5, "qwen3", True), (1.0, 1.0, 2, None, "llama", False),
    (0.7, 0.2, 1, 1.0, "qwen2", True), (0.25, 0.0, 2, None, "qwen3", True),
    (0.0, 0.0, 2, None, "llama", False), (0.5, 0.5, 1, 1.0, "qwen2", True)])
@pytest.mark.parametrize("activations", ["host", "nvme"])
def test_state_on_nvme_trains_exactly_as_in_ram(tmp_path, serial, master, moments, accum, clip,
                                                family, tied, activations):
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=accum, max_grad_norm=clip)
    in_ram = train_run(tmp_path / "ram", Policy.of(), train, family=family, tied=tied)
    policy = Policy.of(master_on_nvme=master, moments_on_nvme=moments, nvme_prefetch=2,
                    activations=activations)
    on_disk = train_run(tmp_path / "disk", policy, train, serial=serial, family=family, tied=tied)
    if activations == "nvme":  # every layer's checkpoint went through its file
        assert on_disk[3] == [f"activations_{i}.bin" for i in range(3)]
    assert on_disk[0] == in_ram[0]
    for name, value in in_ram[1].items():
        assert torch.equal(on_disk[1][name], value), name
    assert_same_moments(on_disk[2], in_ram[2])


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize(("master", "moments", "clip", "family", "tied", "groups"), [
    (0.0, 1.0, None, "llama", False, 3), (0.5, 0.5, 1.0, "qwen2", True, 2)])
def test_layer_major_with_state_and_checkpoints_on_nvme_trains_exactly_as_in_ram(
        tmp_path, device, serial, master, moments, clip, family, tied, groups):
    """A layer-major sweep keeps a checkpoint file per layer and micro-batch (whatever the
    groups its tasks run); on a GPU its checkpoints pass through pinned buffers by O_DIRECT."""
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=3, max_grad_norm=clip)
    in_ram = train_run(tmp_path / "ram", Policy.of(accumulation="layer_major"), train,
                       family=family, tied=tied, device=device)
    policy = Policy.of(accumulation="layer_major", master_on_nvme=master,
                       moments_on_nvme=moments, activations="nvme", sweep_groups=groups)
    on_disk = train_run(tmp_path / "disk", policy, train, serial=serial, family=family, tied=tied,
                        device=device)
    assert on_disk[3] == sorted(f"activations_{i}_{c}.bin" for i in range(3) for c in range(3))
    assert on_disk[0] == in_ram[0]
    for name, value in in_ram[1].items():
        assert torch.equal(on_disk[1][name], value), name
    assert_same_moments(on_disk[2], in_ram[2])


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize(("weights", "master", "moments", "accum", "accumulation", "clip",
                          "family", "tied"), [
    (1.0, 1.0, 1.0, 1, "step_major", None, "llama", False),
    (0.5, 0.0, 0.0, 2, "step_major", 1.0, "qwen2", True),
    (0.3, 0.0, 0.6, 3, "layer_major", None, "qwen3", True),
    (1.0, 0.5, 0.0, 3, "layer_major", 0.5, "llama", False)])
def test_weights_on_nvme_train_exactly_as_in_ram(tmp_path, device, serial, weights, master,
                                                 moments, accum, accumulation, clip, family,
                                                 tied):
    """Each load reads the block's bf16 weights part from its file, each update writes it
    anew; blocks with nothing else on the disk read no state. On a GPU the loads copy from
    page-locked staging on their stream while later reads refill other slots."""
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=accum, max_grad_norm=clip)
    in_ram = train_run(tmp_path / "ram", Policy.of(accumulation=accumulation), train,
                       family=family, tied=tied, device=device)
    policy = Policy.of(accumulation=accumulation, weights_on_nvme=weights,
                       master_on_nvme=master, moments_on_nvme=moments)
    plan = build_plan(spec_of(tiny_config(family, tied), tmp_path), train, policy)
    assert plan.placement.grad_landing != "upload" and plan.placement.weight_staging_slots
    reads = [t for t in plan.tasks if t.kind == "read_weights"]
    loads = [t for t in plan.tasks if t.kind == "load_weights"]
    assert len(reads) == len(loads) and all(t.slot >= 0 for t in loads)
    on_disk = train_run(tmp_path / "disk", policy, train, serial=serial, family=family, tied=tied,
                        device=device)
    assert on_disk[0] == in_ram[0]
    for name, value in in_ram[1].items():
        assert torch.equal(on_disk[1][name], value), name


@pytest.mark.parametrize("accumulation", ["step_major", "layer_major"])
def test_state_striped_over_several_folders_trains_exactly_as_in_one(tmp_path, accumulation):
    """One folder per drive: every block's file is striped over them, the checkpoint files
    spread over them, and the run is the one-folder run bit for bit."""
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    policy = Policy.of(accumulation=accumulation, moments_on_nvme=0.7, master_on_nvme=0.4,
                       weights_on_nvme=0.5, activations="nvme")
    one = train_run(tmp_path / "one", policy, train)
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    drives = [tmp_path / "d0", tmp_path / "d1", tmp_path / "d2"]
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM, device="cpu",
                 nvme_dir=",".join(map(str, drives))) as trainer:
        trainer.init_random(0)
        losses = [log.loss for log in trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 3)]
        weights = dict(trainer.state.named_master())
        for d in drives:
            assert sorted(p.name for p in d.glob("state_*")) == [
                f"state_{b}.s{drives.index(d)}.bin" for b in sorted(trainer.state.nvme.disk_blocks,
                                                                    key=str)]
            assert list(d.glob("activations_*"))  # the checkpoints use every drive
    assert losses == one[0]
    for name, value in one[1].items():
        assert torch.equal(weights[name], value), name
    assert not any(list(d.glob("state_*")) for d in drives)  # scratch, removed at the end


def test_striped_state_checkpoints_and_resumes_bit_for_bit(tmp_path):
    config = tiny_config("qwen2", tied=True)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ)
    policy = Policy.of(moments_on_nvme=0.5, weights_on_nvme=0.5)
    folders = f"{tmp_path / 'a'},{tmp_path / 'b'}"

    def trainer():
        return Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM,
                       device="cpu", nvme_dir=folders)

    with trainer() as whole:
        whole.init_random(0)
        expected = [log.loss for log in whole.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 4)]
    store = CheckpointStore(tmp_path / "ckpt")
    with trainer() as first:
        first.init_random(0)
        first.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 2,
                  checkpoints=CheckpointSchedule(store=store, every_steps=2))
    assert (store.latest().path / "state_0.s1.bin").exists()
    with trainer() as second:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        second.checkpointing.restore_state(store, data)
        resumed = [log.loss for log in second.fit(data, 2)]
    assert resumed == expected[2:]


def test_weights_on_nvme_hold_the_ram_they_save_and_refuse_other_casts(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ)
    with Trainer(config=config, plan=build_plan(spec, train, Policy.of(weights_on_nvme=0.5)),
                 optim=OPTIM, device="cpu", nvme_dir=tmp_path / "nvme") as trainer:
        held = trainer.allocated_bytes()
        for b in trainer.state.upload:
            n, k = trainer.blocks.numel(b), trainer.state.disk_weights[b]
            assert k == round(0.5 * n) and trainer.state.upload[b].numel() == n - k
        assert held["nvme.weights_bf16"] == 2 * sum(trainer.state.disk_weights.values())
    with pytest.raises(ValueError, match="weights_on_nvme.*cast=cpu_once with "
                                         "cpu_optimizer=native"):
        Policy.of(weights_on_nvme=0.5, cast="gpu")
    with pytest.raises(ValueError, match="weights_on_nvme"):
        Policy.of(weights_on_nvme=0.5, cpu_optimizer="torch")


def test_refuses_what_it_cannot_run_before_allocating(tmp_path, monkeypatch):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=1, seq_len=SEQ)

    def make(policy, nvme_dir):
        return Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM,
                       device="cpu", nvme_dir=nvme_dir)

    with pytest.raises(ValueError, match="--nvme-dir"):
        make(Policy.of(moments_on_nvme=0.5), None)
    with pytest.raises(ValueError, match="cpu_optimizer='native'"):
        make(Policy.of(moments_on_nvme=0.5, cpu_optimizer="torch"), tmp_path)
    with pytest.raises(ValueError, match="--nvme-dir"):
        make(Policy.of(activations="nvme"), None)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(nvme_module.NvmeSpaceError, match="cannot be written"):
        make(Policy.of(moments_on_nvme=0.5), tmp_path / "a_file" / "nvme")

    class Tiny:
        free = 1000
    monkeypatch.setattr(nvme_module.shutil, "disk_usage", lambda _path: Tiny())
    with pytest.raises(nvme_module.NvmeSpaceError, match=r"needs 0\.\d+ GB .* 0\.00 GB free"):
        make(Policy.of(moments_on_nvme=0.5), tmp_path / "nvme")


def test_a_full_disk_stops_training_and_leaves_state_and_checkpoint_whole(tmp_path,
                                                                          monkeypatch):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    store = CheckpointStore(tmp_path / "ckpt")
    policy = Policy.of(moments_on_nvme=1.0)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=1, seq_len=SEQ), policy),
                 optim=OPTIM, device="cpu", nvme_dir=tmp_path / "nvme") as trainer:
        trainer.init_random(0)
        data = SyntheticTokens(VOCAB, SEQ)
        trainer.fit(data, 2, checkpoints=CheckpointSchedule(store=store, every_steps=2))
        before = {p.name: p.read_bytes() for p in (tmp_path / "nvme").glob("state_*.bin")}
        real_pwritev = os.pwritev

        def full(fd, buffers, offset):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".next"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_pwritev(fd, buffers, offset)
        monkeypatch.setattr(nvme_module.os, "pwritev", full)
        with pytest.raises(TaskFailedError, match=r"write_state.*No space left.*previous state"):
            trainer.fit(data, 1)
    after = {p.name: p.read_bytes() for p in (tmp_path / "nvme").glob("state_*.bin")}
    assert after == before  # every file is still the one the last good step wrote
    assert not list((tmp_path / "nvme").glob("*.next"))
    store.verify(store.latest())  # and the checkpoint (its links) is intact


def test_checkpoints_link_the_moment_files_and_resume_bit_for_bit(tmp_path):
    config = tiny_config("qwen2", tied=True)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    policy = Policy.of(moments_on_nvme=0.5, master_on_nvme=0.5)

    def trainer(folder):
        return Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM,
                       device="cpu", nvme_dir=folder)

    with trainer(tmp_path / "whole") as whole:
        whole.init_random(0)
        expected = [log.loss for log in whole.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 4)]
    store = CheckpointStore(tmp_path / "ckpt")
    with trainer(tmp_path / "first") as first:
        first.init_random(0)
        first.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 2,
                  checkpoints=CheckpointSchedule(store=store, every_steps=2))
        linked = store.latest().path / "state_0.bin"
        assert linked.stat().st_ino == (tmp_path / "first" / "state_0.bin").stat().st_ino
    # the run ends; a new one in the same folder starts from fresh (zero) state files
    with trainer(tmp_path / "first"):
        assert linked.stat().st_ino != (tmp_path / "first" / "state_0.bin").stat().st_ino
    store.verify(store.latest())
    store.verify(store.latest())
    # a fresh process resuming in the run's own folder: starting the tier must not touch the
    # files the checkpoint links
    with trainer(tmp_path / "first") as second:
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        second.checkpointing.restore_state(store, data)
        resumed = [log.loss for log in second.fit(data, 2)]
    assert resumed == expected[2:]


def test_master_on_nvme_loads_and_saves_hugging_face_folders_whole(tmp_path):
    config = tiny_config("qwen2", tied=True)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=1, seq_len=SEQ)

    def trainer(policy, folder):
        return Trainer(config=config, plan=build_plan(spec, train, policy), optim=OPTIM,
                       device="cpu", nvme_dir=folder)

    with trainer(Policy.of(), None) as in_ram:
        in_ram.init_random(3)
        in_ram.save(tmp_path / "hf")
        expected = {n: v.clone() for n, v in in_ram.state.named_master()}
    with trainer(Policy.of(master_on_nvme=0.6, moments_on_nvme=0.4), tmp_path / "nvme") as on_disk:
        on_disk.load_checkpoint(tmp_path / "hf")
        got = dict(on_disk.state.named_master())
        assert on_disk.state.master[0].numel() < on_disk.blocks.numel(0)  # most of it is on disk
        on_disk.save(tmp_path / "hf_again")
    for name, value in expected.items():  # bf16 on disk: the round trip keeps bf16 values
        assert torch.equal(got[name], value.bfloat16().float()), name
    first = load_file(next((tmp_path / "hf").glob("*.safetensors")))
    again = load_file(next((tmp_path / "hf_again").glob("*.safetensors")))
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_blocks_whose_share_rounds_to_nothing_have_no_file_and_train(tmp_path):
    # the tied head block holds only the final norm (64 params): 0.5% of it rounds to 0
    train = TrainSpec(micro_batch=1, seq_len=SEQ)
    in_ram = train_run(tmp_path / "ram", Policy.of(), train, family="qwen2", tied=True)
    on_disk = train_run(tmp_path / "disk", Policy.of(moments_on_nvme=0.005), train,
                        family="qwen2", tied=True)
    assert on_disk[0] == in_ram[0]
    assert not (tmp_path / "disk" / "nvme" / "state_3.bin").exists()


def test_room_counts_the_copies_kept_checkpoints_end_up_owning(tmp_path, monkeypatch):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    state = {}

    class Room:
        free = 0

    def make(copies):
        return Trainer(config=config,
                       plan=build_plan(spec, TrainSpec(micro_batch=1, seq_len=SEQ),
                                       Policy.of(moments_on_nvme=1.0)),
                       optim=OPTIM, device="cpu", nvme_dir=tmp_path / "nvme",
                       nvme_checkpoint_copies=copies)

    with make(0) as trainer:
        state["files"] = sum(trainer.state.nvme.file_bytes.values())
        state["needed"] = trainer.state.nvme.required_bytes()
    Room.free = state["needed"] + state["files"]  # room for the tier and one checkpoint's copy
    monkeypatch.setattr(nvme_module.shutil, "disk_usage", lambda _path: Room())
    with make(1):
        pass
    with pytest.raises(nvme_module.NvmeSpaceError, match="needs"):
        make(2)


def test_closing_deletes_the_scratch_files_and_leaves_checkpoints_whole(tmp_path):
    config = tiny_config("llama", tied=False)
    spec = spec_of(config, tmp_path)
    folder = tmp_path / "nvme"
    store = CheckpointStore(tmp_path / "ckpt")
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ),
                                 Policy.of(moments_on_nvme=1.0, activations="nvme")),
                 optim=OPTIM, device="cpu", nvme_dir=folder) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 2,
                    checkpoints=CheckpointSchedule(store=store, every_steps=2))
        assert sorted(folder.glob("state_*.bin")) and sorted(folder.glob("activations_*.bin"))
        (folder / "activations_99.bin").write_bytes(b"another run's")  # a shared folder
    assert not list(folder.glob("state_*"))
    assert [p.name for p in folder.glob("activations_*")] == ["activations_99.bin"]
    store.verify(store.latest())  # its hard links still hold the state the run ended with


def _checkpoint(numel: int, source: torch.Tensor | None = None) -> torch.Tensor:
    host = nvme_module.ActivationFiles.host_buffer(numel, torch.bfloat16, pinned=False)
    host.copy_(torch.randn(numel) if source is None else source)
    return host


def test_activation_checkpoints_go_to_disk_in_whole_blocks_under_o_direct(tmp_path):
    """As calibrate measures the disk: O_DIRECT, the file padded to whole 4 KiB blocks from
    the page-aligned buffer host_buffer makes (1000 bf16 values: 2000 bytes, one block)."""
    if not nvme_module.supports_direct(tmp_path):
        pytest.skip(f"{tmp_path} does not take O_DIRECT")
    files = nvme_module.ActivationFiles(tmp_path, num_layers=2, copies=2)
    written = _checkpoint(1000)
    assert written.data_ptr() % 4096 == 0 and written.numel() == 1000
    files.write(1, written, copy=1)
    assert files.path(1, 1).stat().st_size == 4096
    back = _checkpoint(1000, torch.zeros(1000))
    files.read(1, back, copy=1)
    assert torch.equal(back, written)


def test_a_checkpoint_without_room_for_whole_blocks_goes_through_the_page_cache(tmp_path,
                                                                                 monkeypatch):
    files = nvme_module.ActivationFiles(tmp_path, num_layers=1)
    plain = torch.randn(1000).bfloat16()  # the heap's: neither aligned nor padded
    files.write(0, plain)
    assert files.path(0).stat().st_size == 2000
    back = torch.zeros(1000, dtype=torch.bfloat16)
    files.read(0, back)
    assert torch.equal(back, plain)
    # a folder whose filesystem refuses O_DIRECT (tmpfs) takes host_buffer's tensors too
    monkeypatch.setattr(nvme_module, "supports_direct", lambda folder: False)
    (tmp_path / "tmpfs").mkdir()
    files = nvme_module.ActivationFiles(tmp_path / "tmpfs", num_layers=1)
    written = _checkpoint(1000)
    files.write(0, written)
    assert files.path(0).stat().st_size == 2000
    back = _checkpoint(1000, torch.zeros(1000))
    files.read(0, back)
    assert torch.equal(back, written)


def test_activation_io_can_go_through_the_page_cache_and_refuses_other_settings(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("LAYERSLIDE_ACTIVATION_IO", "buffered")
    files = nvme_module.ActivationFiles(tmp_path, num_layers=1)
    written = _checkpoint(1000)
    files.write(0, written)
    assert files.path(0).stat().st_size == 2000  # the tensor's own bytes: no O_DIRECT blocks
    monkeypatch.setenv("LAYERSLIDE_ACTIVATION_IO", "cached")
    with pytest.raises(ValueError, match="LAYERSLIDE_ACTIVATION_IO='cached': set it to 'direct'"):
        nvme_module.ActivationFiles(tmp_path, num_layers=1)


def test_a_checkpoint_reads_back_whichever_way_it_was_written(tmp_path):
    if not nvme_module.supports_direct(tmp_path):
        pytest.skip(f"{tmp_path} does not take O_DIRECT")
    files = nvme_module.ActivationFiles(tmp_path, num_layers=2)
    through_cache = torch.randn(1000).bfloat16()  # written as it is: 2000 bytes
    files.write(0, through_cache)
    back = _checkpoint(1000, torch.zeros(1000))  # read where O_DIRECT would take whole blocks
    files.read(0, back)
    assert torch.equal(back, through_cache)
    direct = _checkpoint(1000)  # written in a whole block: 4096 bytes
    files.write(1, direct)
    plain = torch.zeros(1000, dtype=torch.bfloat16)
    files.read(1, plain)
    assert torch.equal(plain, direct)


def test_a_folder_whose_o_direct_fails_on_the_memory_goes_on_through_the_page_cache(
        tmp_path, monkeypatch):
    """Some drivers map pinned memory so that the disk's DMA cannot reach it (EFAULT)."""
    files = nvme_module.ActivationFiles(tmp_path, num_layers=1)
    files.direct[tmp_path] = True
    real = nvme_module.write_fully

    def refuse_direct(fd, view):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EFAULT, "Bad address")
        real(fd, view)
    monkeypatch.setattr(nvme_module, "write_fully", refuse_direct)
    written = _checkpoint(1000)
    with pytest.warns(UserWarning, match="go through the page cache"):
        files.write(0, written)
    assert not files.direct[tmp_path] and files.path(0).stat().st_size == 2000
    back = _checkpoint(1000, torch.zeros(1000))
    files.read(0, back)
    assert torch.equal(back, written)
    # a disk that is full is no reason to leave O_DIRECT: it stops training as before
    files.direct[tmp_path] = True
    monkeypatch.setattr(nvme_module, "write_fully",
                        lambda fd, view: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(nvme_module.NvmeSpaceError, match="activation checkpoint"):
        files.write(0, written)
    assert files.direct[tmp_path]


def test_a_folder_another_run_holds_is_refused_and_a_closed_runs_is_free(tmp_path):
    config = tiny_config("llama", False)
    spec = spec_of(config, tmp_path)
    plan = build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of(moments_on_nvme=1))
    folder = tmp_path / "nvme"
    folder.mkdir()
    with open(folder / nvme_module.LOCK_NAME, "a+") as other:  # a run of another process
        other.write("pid 4242")
        other.flush()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=r"the NVMe folder .*nvme is in use by another run "
                                             r"\(pid 4242\): give this run a folder of its own"):
            Trainer(config=config, plan=plan, optim=OPTIM, device="cpu", nvme_dir=folder)
    for _ in range(2):  # free once that run has ended, and once this one has closed
        with Trainer(config=config, plan=plan, optim=OPTIM, device="cpu",
                     nvme_dir=folder) as trainer:
            trainer.init_random(0)
            trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 1)
