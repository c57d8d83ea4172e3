"""The executor against plain PyTorch mixed-precision AdamW, serial against overlapped, save/load.

Tolerances: the executor and the reference both compute in bf16 with fp32 master weights, but
not with identical kernels (the head's loss gradient is formed as softmax - onehot in fp32 and
cast to bf16, the reference goes through log_softmax's backward; the LM head's weight grad is
summed over token chunks). Each bf16 rounding is at most 2^-8 relative, so grads agree to a few
bf16 ulps per tensor (measured: 0.4-2% relative), while a wrong block, scale or missing term is
off by O(1). AdamW's early updates are ~lr * sign(grad), so elements whose grad is ~0 may flip
sign: the weights are compared relative to the size of the whole update.
"""

from __future__ import annotations

import pytest
import torch
from helpers import SEQ, VOCAB, PackedDocuments, spec_of, tiny_config
from reference_training import ReferenceTrainer
from transformers import AutoModelForCausalLM

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.optim import OptimConfig
from layerslide.planner.build import build_plan
from layerslide.planner.plan import task_id
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training.trainer import Trainer

GPU = pytest.param("cuda", marks=pytest.mark.gpu)


def run_executor(config, spec, train, policy, optim, *, steps, serial=False, device="cpu",
                 segment_steps=3, poison=None, check_uploads=False):
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=optim, device=device,
                 serial=serial, segment_steps=segment_steps) as trainer:
        trainer.init_random(0)
        if poison is not None:
            block, index = poison
            trainer.state.master[block][index] = float("inf")
            trainer.weights_changed()
        initial = {n: v.clone() for n, v in trainer.state.named_master()}
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), steps)
        final = {n: v.clone() for n, v in trainer.state.named_master()}
        moments = dict(trainer.state.steps_taken)
        if check_uploads:  # what the next forward loads: the weights, not grads that landed
            for block, upload in trainer.state.upload.items():
                assert torch.equal(upload, trainer.state.master[block].to(torch.bfloat16)), block
    return logs, initial, final, moments


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize(("family", "tied", "accum", "clip", "optimizer"), [
    ("llama", False, 1, None, "native"), ("llama", False, 2, 1.0, "native"),
    ("qwen2", True, 2, None, "native"), ("qwen3", True, 1, 0.5, "native"),
    ("llama", False, 1, 1.0, "torch"), ("qwen2", True, 2, None, "torch"),
    ("llama", False, 2, 1.0, "gpu:3"), ("qwen2", True, 1, None, "gpu:5"),
    ("llama", False, 1, None, "pool:2"), ("qwen2", True, 2, None, "pool:1"),
    ("llama", False, 1, 1.0, "gpu_layers:2"), ("qwen2", True, 2, None, "gpu_layers:4")])
def test_matches_plain_pytorch_reference(tmp_path, device, family, tied, accum, clip, optimizer):
    """optimizer: the CPU optimizer, gpu:N for the first N blocks updated on the GPU (the
    embedding first), gpu_layers:N for the first N with the decoder layers first (4 of a 3-layer
    model: the layers and the head, the embedding on the CPU), or pool:N for N pinned host grad
    buffers shared by all blocks (and cast on the GPU)."""
    kind, _, count = optimizer.partition(":")
    policy = {"gpu": lambda: Policy.of(gpu_updated_blocks=int(count)),
              "gpu_layers": lambda: Policy.of(gpu_updated_blocks=int(count),
                                           gpu_updated_order="layers_first"),
              "pool": lambda: Policy.of(host_grad_buffers=int(count), cast="gpu")}.get(
                  kind, lambda: Policy.of(cpu_optimizer=optimizer))()
    _check_against_reference(tmp_path, device, family, tied, accum, clip, policy)


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize(("family", "tied", "accum", "clip", "policy"), [
    ("llama", False, 3, 1.0, {}), ("qwen2", True, 2, None, {}),
    ("qwen2", True, 3, 1.0, {"gpu_updated_blocks": 2}),
    ("llama", False, 2, None, {"gpu_updated_blocks": 3, "gpu_updated_order": "layers_first"}),
    ("qwen2", True, 2, None, {"host_grad_buffers": 2, "cast": "gpu", "window": 1}),
    ("llama", False, 2, 1.0, {"cpu_optimizer": "torch", "activations": "gpu"}),
    ("qwen3", True, 4, None, {"cast": "cpu_per_load", "window": 3, "prefetch_depth": 2}),
    ("llama", False, 4, 1.0, {"sweep_groups": 2}),  # tasks of two micro-batches each
    ("qwen2", True, 3, None, {"sweep_groups": 2, "gpu_updated_blocks": 1}),  # of 2 and 1
    ("llama", False, 3, None, {"sweep_groups": 1, "activations": "gpu"})])
def test_layer_major_matches_plain_pytorch_reference(tmp_path, device, family, tied, accum,
                                                     clip, policy):
    """Layer-major accumulation: grads summed on the GPU over the step's micro-batches."""
    _check_against_reference(tmp_path, device, family, tied, accum, clip,
                             Policy.of(accumulation="layer_major", **policy))


def _check_against_reference(tmp_path, device, family, tied, accum, clip, policy):
    config = tiny_config(family, tied)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=accum, max_grad_norm=clip)
    optim = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=2, decay_steps=4)
    steps = 4
    logs, initial, final, _ = run_executor(config, spec, train, policy, optim, steps=steps,
                                           device=device)
    reference = ReferenceTrainer(config, initial, lr_at=optim.lr_at, weight_decay=0.1,
                                 grad_accum=accum, max_grad_norm=clip)
    data = SyntheticTokens(VOCAB, SEQ, seed=1)
    ref_losses = [reference.step([data.next_batch(2) for _ in range(accum)])[0]
                  for _ in range(steps)]
    assert [log.loss for log in logs] == pytest.approx(ref_losses, rel=1e-3)
    update = torch.cat([(reference.params[n].detach() - initial[n]).flatten() for n in initial])
    diff = torch.cat([(reference.params[n].detach() - final[n]).flatten() for n in initial])
    assert update.norm() > 0
    assert diff.norm() / update.norm() < 0.1
    if clip is not None:
        assert all(log.grad_norm is not None and log.grad_norm > 0 for log in logs)


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize("policy", [
    Policy.of(), Policy.of(window=3, prefetch_depth=2, activations="gpu"),
    Policy.of(cast="cpu_per_load", cast_worker=True, optimizer_order="arrival"),
    Policy.of(cast="gpu", resident_layers=1, head_loss="materialized"),
    Policy.of(cpu_optimizer="torch"), Policy.of(gpu_updated_blocks=2),
    Policy.of(gpu_updated_blocks=5, activations="gpu"),
    Policy.of(host_grad_buffers=2, cast="gpu"),
    Policy.of(accumulation="layer_major"),
    Policy.of(accumulation="layer_major", gpu_updated_blocks=2, cast="cpu_per_load"),
    Policy.of(accumulation="layer_major", host_grad_buffers=1, window=1),
    Policy.of(accumulation="layer_major", sweep_groups=1),
    Policy.of(lane_waits="watch"), Policy.of(accumulation="layer_major", lane_waits="watch")])
def test_serial_and_overlapped_agree_exactly(tmp_path, device, policy):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2, max_grad_norm=1.0)
    optim = OptimConfig(lr=1e-3, weight_decay=0.1)
    serial = run_executor(config, spec, train, policy, optim, steps=4, serial=True,
                          device=device)
    overlapped = run_executor(config, spec, train, policy, optim, steps=4, device=device)
    assert [log.loss for log in serial[0]] == [log.loss for log in overlapped[0]]
    for name in serial[2]:
        assert torch.equal(serial[2][name], overlapped[2][name]), name
    assert any(not torch.equal(serial[1][n], serial[2][n]) for n in serial[1])


def test_segments_do_not_change_the_result(tmp_path):
    config = tiny_config("qwen2", tied=True)
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ)
    optim = OptimConfig(lr=1e-3, warmup_steps=2, decay_steps=3)
    one = run_executor(config, spec, train, Policy.of(), optim, steps=5, segment_steps=5)
    many = run_executor(config, spec, train, Policy.of(), optim, steps=5, segment_steps=2)
    assert [log.loss for log in one[0]] == [log.loss for log in many[0]]
    assert [log.step for log in many[0]] == [0, 1, 2, 3, 4]
    assert all(torch.equal(one[2][n], many[2][n]) for n in one[2])


@pytest.mark.parametrize(("serial", "accumulation", "gpu_updated"), [
    (False, "step_major", 0), (True, "step_major", 0), (False, "layer_major", 0),
    (False, "step_major", 2)])
def test_a_stop_mid_segment_ends_after_the_step_in_flight_as_if_the_run_were_that_long(
        tmp_path, serial, accumulation, gpu_updated):
    """Set once step 1 has run, the stop cuts the 6-step segment after the step the GPU is in:
    the state is that of a run of as many steps, and the data resumes where it would. With
    blocks updated on the GPU a lane could begin a task of a cut step whose inputs the cut
    then skipped (it decided before waiting for them)."""
    import threading

    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    policy = Policy.of(accumulation=accumulation, gpu_updated_blocks=gpu_updated)
    optim = OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=6)
    stop = threading.Event()

    def stop_after_step_1(step: int) -> None:
        if step == 1:
            stop.set()

    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=optim,
                 device="cpu", serial=serial, segment_steps=6) as trainer:
        trainer.init_random(0)
        data = SyntheticTokens(VOCAB, SEQ, seed=1)
        logs = trainer.fit(data, 6, on_step_done=stop_after_step_1, stop=stop)
        stopped = {n: v.clone() for n, v in trainer.state.named_master()}
        assert trainer.stopped and 2 <= len(logs) < 6 and trainer.step == len(logs)
        next_batch = data.next_batch(2)
    whole, _, final, _ = run_executor(config, spec, train, policy, optim, steps=len(logs),
                                      serial=serial, segment_steps=6)
    assert [log.loss for log in logs] == [log.loss for log in whole]
    assert all(torch.equal(stopped[n], final[n]) for n in final)
    fresh = SyntheticTokens(VOCAB, SEQ, seed=1)
    for _ in range(len(logs) * train.grad_accum):
        fresh.next_batch(2)
    assert all(torch.equal(a, b) for a, b in zip(next_batch, fresh.next_batch(2), strict=True))


def test_non_finite_step_is_skipped_with_state_intact(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, max_grad_norm=1.0)
    logs, initial, final, moments = run_executor(
        config, spec, train, Policy.of(), OptimConfig(lr=1e-3), steps=2, poison=(1, 5),
        check_uploads=True)
    assert all(log.skipped for log in logs)
    assert all(torch.equal(initial[n], final[n]) for n in initial)
    assert all(taken == 0 for taken in moments.values())  # AdamW never stepped


@pytest.mark.parametrize("gpu_updated", [0, 2])
def test_non_finite_blocks_are_skipped_without_clipping(tmp_path, gpu_updated):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    logs, initial, final, _ = run_executor(
        config, spec, TrainSpec(micro_batch=2, seq_len=SEQ),
        Policy.of(gpu_updated_blocks=gpu_updated), OptimConfig(lr=1e-3),
        steps=1, poison=(2, 0),  # layer 2: its grads, and everything before it, are NaN
        check_uploads=True)
    assert not logs[0].skipped
    assert set(logs[0].skipped_blocks) >= {-1, 0, 1, 2}
    assert torch.equal(initial["model.layers.0.mlp.up_proj.weight"],
                       final["model.layers.0.mlp.up_proj.weight"])


def test_saved_folder_loads_in_transformers_with_the_same_logits(tmp_path):
    config = tiny_config("qwen3", tied=True)
    spec = spec_of(config, tmp_path)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu") as trainer:
        trainer.init_random(3)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 2)
        folder = trainer.save(tmp_path / "out")
        master = {n: v.clone() for n, v in trainer.state.named_master()}
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    expected = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    expected.load_state_dict({n: v.to(torch.bfloat16) for n, v in master.items()}, strict=False)
    expected.tie_weights()
    # from_pretrained keeps the rotary inv_freq buffer in fp32, .to(bf16) rounds it: not weights
    expected.model.rotary_emb.inv_freq = loaded.model.rotary_emb.inv_freq.clone()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, expected(input_ids=ids).logits)

    # and the executor reads that folder back into the same master weights (bf16-rounded)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(), device="cpu") as trainer:
        trainer.load_checkpoint(folder)
        for name, value in trainer.state.named_master():
            assert torch.equal(value, master[name].to(torch.bfloat16).float()), name


def test_executor_refuses_what_it_does_not_run(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ)
    with pytest.raises(ValueError, match="NVMe"):
        Trainer(config=config, plan=build_plan(spec, train, Policy.of(moments_on_nvme=0.5)),
                optim=OptimConfig(), device="cpu")
    other = spec_of(tiny_config("qwen2"), tmp_path / "other")  # q/k/v biases: other sizes
    with pytest.raises(ValueError, match="plan is for"):
        Trainer(config=config, plan=build_plan(other, train, Policy.of()), optim=OptimConfig(),
                device="cpu")


def test_trace_uses_the_plan_task_ids(tmp_path):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(), device="cpu", segment_steps=3) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 3)
        trace = trainer.trace()
    ids = {e.task_id for e in trace.events}
    expected = [("forward", -1, 0), ("backward", 0, 2), ("optimizer_step", 2, 1)]
    assert {task_id(kind=kind, block=block, step=step, micro_batch=0,
                    num_layers=spec.num_layers) for kind, block, step in expected} <= ids
    assert all(e.end_s >= e.start_s >= 0 for e in trace.events)
    assert trace.source == "measured" and trace.peak_bytes("host") > 0


def test_the_trace_keeps_stream_tasks_enqueues_on_its_clock_across_segments(tmp_path):
    config = tiny_config("llama")
    with Trainer(config=config, plan=build_plan(spec_of(config, tmp_path),
                                                TrainSpec(micro_batch=1, seq_len=SEQ),
                                                Policy.of()),
                 optim=OptimConfig(), device="cpu", segment_steps=1) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 2)
        trace = trainer.trace()
    # on the CPU device a stream task runs in its lane's thread as it is enqueued
    gpu = [e for e in trace.events if e.lane == "gpu"]
    assert {e.step for e in gpu} == {0, 1}
    assert all(e.dispatch_start_s == e.start_s and e.dispatch_end_s == e.end_s for e in gpu)
    first_end = max(e.end_s for e in trace.events if e.step == 0)
    assert all(e.dispatch_start_s >= first_end for e in gpu if e.step == 1)
    assert all(e.dispatch_start_s is None for e in trace.events if e.lane == "cpu")


@pytest.mark.parametrize(("keep_trace", "traced_steps"), [
    (False, set()), (2, {0, 1}), (3, {0, 1, 2, 3}), (True, {0, 1, 2, 3, 4, 5})])
def test_a_trace_kept_for_n_steps_holds_the_segments_that_start_before_them(
        tmp_path, keep_trace, traced_steps):
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(), device="cpu", segment_steps=2,
                 keep_trace=keep_trace) as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 6)
        assert {e.step for e in trainer.trace().events} == traced_steps
    for bad in (-1, 2.5, None):
        with pytest.raises(ValueError, match=f"keep_trace={bad!r}"):
            Trainer(config=config, plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ),
                                                   Policy.of()),
                    optim=OptimConfig(), device="cpu", keep_trace=bad)


def test_without_a_c_compiler_the_torch_kernels_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSLIDE_NATIVE", "0")  # as if no compiler were found
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, max_grad_norm=1.0)
    optim = OptimConfig(lr=1e-3, weight_decay=0.1)
    logs, initial, final, _ = run_executor(config, spec, train, Policy.of(), optim, steps=3)
    reference = ReferenceTrainer(config, initial, lr_at=optim.lr_at, weight_decay=0.1,
                                 max_grad_norm=1.0)
    data = SyntheticTokens(VOCAB, SEQ, seed=1)
    ref_losses = [reference.step([data.next_batch(2)])[0] for _ in range(3)]
    # the plan has no cast tasks (the native optimizer would write the bf16 weights): the
    # fallback casts in the optimizer step, so the later losses still see updated weights
    assert [log.loss for log in logs] == pytest.approx(ref_losses, rel=1e-3)
    update = torch.cat([(reference.params[n].detach() - initial[n]).flatten() for n in initial])
    diff = torch.cat([(reference.params[n].detach() - final[n]).flatten() for n in initial])
    assert diff.norm() / update.norm() < 0.1


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_bf16_upload_copy_follows_every_update(tmp_path, monkeypatch, native):
    monkeypatch.setenv("LAYERSLIDE_NATIVE", native)
    config = tiny_config("llama")
    with Trainer(config=config,
                 plan=build_plan(spec_of(config, tmp_path), TrainSpec(micro_batch=2, seq_len=SEQ),
                                 Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu") as trainer:
        assert (trainer.state.native is not None) == (native == "1")
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ), 2)
        for block, upload in trainer.state.upload.items():
            assert torch.equal(upload, trainer.state.master[block].to(torch.bfloat16)), block
        # the grads landed in those copies: no landing buffers of their own
        assert not trainer.state.landing and not trainer.state.landing_pool
        assert trainer.state.landing_buffer(0, 0) is trainer.state.upload[0]


def test_accumulating_steps_keep_landing_buffers_apart_from_the_upload_copies(tmp_path):
    """With two micro-batches the second loads each block again after the first one's grads
    landed: they must not land in the copy it loads."""
    config = tiny_config("llama")
    with Trainer(config=config,
                 plan=build_plan(spec_of(config, tmp_path),
                                 TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2), Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu") as trainer:
        assert set(trainer.state.landing) == set(trainer.state.upload)
        assert trainer.state.landing_buffer(0, 0) is not trainer.state.upload[0]


@pytest.mark.parametrize(("family", "tied"), [("llama", False), ("qwen2", True)])
def test_first_step_grads_match_the_reference_per_tensor(tmp_path, family, tied):
    """Before AdamW amplifies differences: every tensor's accumulated grad within a few bf16
    ulps of plain autograd's (measured 0.4-2% relative; a wrong block would be O(1))."""
    config = tiny_config(family, tied)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    with Trainer(config=config, plan=build_plan(spec_of(config, tmp_path), train, Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu", segment_steps=1) as trainer:
        trainer.init_random(0)
        initial = {n: v.clone() for n, v in trainer.state.named_master()}
        trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 1)
        ours = {s.name: trainer.state.grad32[b][s.offset:s.offset + s.numel].view(s.shape)
                for b in trainer.blocks.blocks for s in trainer.blocks.layouts[b]}
    reference = ReferenceTrainer(config, initial, lr_at=lambda _: 0.0, grad_accum=2)
    data = SyntheticTokens(VOCAB, SEQ, seed=1)
    sums = reference.grad_sums([data.next_batch(2) for _ in range(2)])
    assert set(ours) <= set(sums)
    for name, grad in ours.items():
        assert (grad - sums[name]).norm() / sums[name].norm() < 3e-2, name


def test_random_init_drawn_on_threads_in_place_equals_each_block_drawn_alone(tmp_path):
    config = tiny_config("qwen2", tied=True)
    spec = spec_of(config, tmp_path)
    with Trainer(config=config,
                 plan=build_plan(spec, TrainSpec(micro_batch=1, seq_len=SEQ), Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu") as trainer:
        trainer.init_random(7)
        for b in trainer.blocks.blocks:
            assert torch.equal(trainer.state.master[b], trainer.blocks.init_block(b, 7)), b
        assert trainer.state.master[0].std() > 0  # a layer's matrices were drawn
        with pytest.raises(ValueError, match="out must be"):
            trainer.blocks.init_block(0, 7, out=torch.empty(3))


def _edited(plan, edit):
    """The plan as a file, edited, and read back: what `train --plan` runs."""
    from layerslide.planner.plan import Plan

    data = plan.to_dict()
    edit(data)
    return Plan.from_dict(data)


def _losses_and_cpu_order(config, plan, steps=3):
    with Trainer(config=config, plan=plan, optim=OptimConfig(lr=1e-2), device="cpu",
                 serial=True) as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), steps)
        cpu = [e.task_id for e in sorted(trainer.trace_events, key=lambda e: e.start_s)
               if e.lane == "cpu"]
    return [log.loss for log in logs], cpu


def test_the_executor_follows_the_units_and_the_lane_order_of_a_plan_file(tmp_path):
    config = tiny_config("llama")
    plan = build_plan(spec_of(config, tmp_path), TrainSpec(micro_batch=2, seq_len=SEQ),
                      Policy.of(window=2, prefetch_depth=1), num_steps=3)
    losses, cpu_order = _losses_and_cpu_order(config, plan)

    def swap_units(data):  # the ring's two units trade places: the same computation
        for t in data["tasks"]:
            if t["unit"] >= 0:
                t["unit"] = 1 - t["unit"]

    assert _losses_and_cpu_order(config, _edited(plan, swap_units))[0] == losses

    def one_unit(data):  # every layer into unit 0: a backward finds another layer's weights
        for t in data["tasks"]:
            t["unit"] = min(0, t["unit"])

    clobbered = _losses_and_cpu_order(config, _edited(plan, one_unit))[0]
    assert clobbered[0] == losses[0] and clobbered[1] != losses[1]

    # with clipping every update waits for the norm: the lane's order alone says which runs first
    plan = build_plan(spec_of(config, tmp_path), TrainSpec(micro_batch=2, seq_len=SEQ,
                                                           max_grad_norm=1.0),
                      Policy.of(window=2, prefetch_depth=1), num_steps=3)
    _, cpu_order = _losses_and_cpu_order(config, plan)
    first, second = [t for t in cpu_order if ".optimizer_step." in t][:2]

    def swap_first_updates(data):
        order = data["lane_order"]["cpu"]
        i, j = order.index(first), order.index(second)
        order[i], order[j] = order[j], order[i]
        tasks = {t["id"]: t for t in data["tasks"]}
        tasks[first]["priority"], tasks[second]["priority"] = (tasks[second]["priority"],
                                                               tasks[first]["priority"])

    _, swapped_order = _losses_and_cpu_order(config, _edited(plan, swap_first_updates))
    updates = [t for t in swapped_order if ".optimizer_step." in t]
    assert updates[:2] == [second, first]


def test_a_plan_file_naming_a_landing_slot_that_is_not_there_is_refused(tmp_path):
    config = tiny_config("llama")
    plan = build_plan(spec_of(config, tmp_path), TrainSpec(micro_batch=1, seq_len=SEQ),
                      Policy.of(cast="cpu_per_load", host_grad_buffers=2), num_steps=3)
    assert plan.placement.grad_landing == "pool"

    def off_the_pool(data):
        offload = next(t for t in data["tasks"] if t["kind"] == "offload_grads")
        offload["slot"] = 2

    with Trainer(config=config, plan=_edited(plan, off_the_pool), optim=OptimConfig(),
                 device="cpu") as trainer:
        trainer.init_random(0)
        with pytest.raises(ValueError, match="slot 2 is not one of the plan's 2 landing"):
            trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 1)


@pytest.mark.parametrize("device", ["cpu", GPU])
@pytest.mark.parametrize("policy", [Policy.of(), Policy.of(accumulation="layer_major",
                                                           activations="gpu")])
def test_packed_documents_attend_only_within_themselves(tmp_path, device, policy):
    """Rows with position_ids train as if each document were a sequence of its own: the losses
    are the reference's that runs every document alone, and not those of whole rows."""
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2)
    optim = OptimConfig(lr=1e-3, warmup_steps=1, decay_steps=3)
    with Trainer(config=config, plan=build_plan(spec, train, policy), optim=optim,
                 device=device, segment_steps=2) as trainer:
        trainer.init_random(0)
        initial = {n: v.clone() for n, v in trainer.state.named_master()}
        logs = trainer.fit(PackedDocuments(seed=3), 3)
    data = PackedDocuments(seed=3)
    batches = [[data.next_batch(2) for _ in range(2)] for _ in range(3)]
    by_document = ReferenceTrainer(config, initial, lr_at=optim.lr_at, grad_accum=2)
    whole_rows = ReferenceTrainer(config, initial, lr_at=optim.lr_at, grad_accum=2)
    expected = [by_document.step(step)[0] for step in batches]
    crossing = [whole_rows.step([b[:2] for b in step])[0] for step in batches]
    losses = torch.tensor([log.loss for log in logs], dtype=torch.float64)
    assert losses.tolist() == pytest.approx(expected, rel=1e-3)
    # random weights and labels: every loss is near ln(vocab); the masks' mark is the gap
    miss = (losses - torch.tensor(expected)).abs().max()
    assert (losses - torch.tensor(crossing)).abs().max() > 5 * miss


@pytest.mark.parametrize("serial", [False, True])
def test_each_step_is_logged_while_later_steps_of_its_segment_still_run(tmp_path, serial):
    """A log file outside a terminal gets each step's record as the step lands, not a burst
    when the segment drains: the segment's last step cannot run until its first step's log
    has come (a lane waits for it in on_step_done; a log made at the end would never come)."""
    import threading

    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)
    train = TrainSpec(micro_batch=2, seq_len=SEQ)
    first_logged, logged = threading.Event(), []

    def on_step(log) -> None:
        logged.append(log.step)
        first_logged.set()

    def on_step_done(step: int) -> None:
        if step == 2:  # the engine's thread: step 3 runs only after this returns
            assert first_logged.wait(60), "the first step was not logged before the last ran"

    with Trainer(config=config, plan=build_plan(spec, train, Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu", serial=serial,
                 segment_steps=4) as trainer:
        trainer.init_random(0)
        logs = trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 4, on_step=on_step,
                           on_step_done=on_step_done)
    assert logged == [0, 1, 2, 3] == [log.step for log in logs]
    assert all(log.step_s > 0 and log.loss > 0 for log in logs)


def test_a_failing_step_callback_is_raised_with_the_steps_it_ran_counted(tmp_path):
    """on_step raising (a user's callback) stops the logs, not the segment: fit() raises it
    once the segment has run, with the trainer's step counting every step that ran."""
    config = tiny_config("llama")
    spec = spec_of(config, tmp_path)

    def broken(log) -> None:
        raise RuntimeError("callback broke")

    with Trainer(config=config, plan=build_plan(spec, TrainSpec(micro_batch=2, seq_len=SEQ),
                                                Policy.of()),
                 optim=OptimConfig(lr=1e-3), device="cpu", segment_steps=3) as trainer:
        trainer.init_random(0)
        with pytest.raises(RuntimeError, match="callback broke"):
            trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 6, on_step=broken)
        assert trainer.step == 3 and not trainer.failed
