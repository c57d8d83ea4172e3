import weakref
from dataclasses import replace

import pytest
import torch
from helpers import SEQ, VOCAB, spec_of, tiny_config

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.device import LaneDevice
from layerslide.executor.optim import OptimConfig
from layerslide.executor.runner import TaskRunner, check_slot, checkpoint_views
from layerslide.kinds import TaskKind
from layerslide.planner.build import build_plan
from layerslide.planner.plan import EMBEDDING, NO_SLOT
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training import trainer as trainer_module
from layerslide.training.trainer import Trainer


def test_the_layers_checkpoints_are_views_of_one_buffer_without_rounding():
    # 28 checkpoints of 48 MiB would take 64 MiB each from torch's pinned allocator; one
    # buffer holds exactly 28 x 48 MiB (here: 5 layers x 2 copies x 7 elements)
    views = checkpoint_views(LaneDevice("cpu"), 5, 2, 7, torch.bfloat16)
    assert sorted(views) == [(i, c) for i in range(5) for c in range(2)]
    base = views[(0, 0)].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base for v in views.values())
    assert views[(0, 0)].untyped_storage().nbytes() == 5 * 2 * 7 * 2
    for n, key in enumerate(sorted(views)):  # disjoint, in (layer, copy) order
        views[key].fill_(n)
    assert [int(views[key][0]) for key in sorted(views)] == list(range(10))
    assert all(v.numel() == 7 and v.is_contiguous() for v in views.values())


@pytest.mark.parametrize("tied", [False, True])
def test_a_layer_major_blocks_grads_are_gone_before_its_sum_is_rounded(tmp_path, monkeypatch,
                                                                        tied):
    # the plan makes the rounded sum as the sweep's last task ends, its scratch gone: a grad
    # still referenced then is a [V, h] tensor more at the embedding than the plan says
    handed, alive_at_rounding = {}, {}
    keep, summed = TaskRunner._keep_grads, TaskRunner._summed

    def keep_grads(self, s, m, block, grads):
        handed[block] = [weakref.ref(g) for g in grads if g is not None]
        keep(self, s, m, block, grads)

    def rounded(self, s, m, block):
        if m == self.train.grad_accum - 1:
            alive_at_rounding[block] = sum(ref() is not None for ref in handed.get(block, ()))
        summed(self, s, m, block)

    monkeypatch.setattr(TaskRunner, "_keep_grads", keep_grads)
    monkeypatch.setattr(TaskRunner, "_summed", rounded)
    config = tiny_config("llama", tied=tied)
    plan = build_plan(spec_of(config, tmp_path),
                      TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
                      Policy.of(accumulation="layer_major"))
    with Trainer(config=config, plan=plan, optim=OptimConfig(lr=1e-3), device="cpu") as trainer:
        trainer.init_random(0)
        trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 1)
    # a tied embedding adds its rows into the sum the heads began: no grads of its own
    assert (EMBEDDING in handed) != tied
    assert EMBEDDING in alive_at_rounding and plan.model.num_layers - 1 in alive_at_rounding
    assert alive_at_rounding == dict.fromkeys(alive_at_rounding, 0)


class _InterpreterView:
    """A policy as the interpreter may read it: its kernels and executor settings. Its residency
    and schedule are the planner's, written into the plan's placement: reading them fails."""

    def __init__(self, policy: Policy):
        self.kernels, self.executor = policy.kernels, policy.executor

    def __getattr__(self, name: str):
        raise AssertionError(f"the interpreter read the policy's {name}")


# each value of each placement field the interpreter reads: where loads come from, where grads
# are summed and land, where checkpoints wait, who writes the upload copy, the moments' format
FOLLOWED = [
    (TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2), Policy.of(cast="gpu")),
    (TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
     Policy.of(cast="cpu_per_load", accumulation="layer_major", host_grad_buffers=2,
               activations="nvme")),
    (TrainSpec(micro_batch=1, seq_len=SEQ),
     Policy.of(moment_precision="bf16", moments_on_nvme=0.5, weights_on_nvme=0.5,
               activations="gpu")),
    (TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2), Policy.of(cpu_optimizer="torch")),
]


@pytest.mark.parametrize(("train", "policy"), FOLLOWED)
def test_the_interpreter_follows_the_placement_and_never_reads_residency_or_schedule(
        tmp_path, monkeypatch, train, policy):
    config = tiny_config("llama")
    plan = build_plan(spec_of(config, tmp_path), train, policy)

    def losses() -> list[float]:
        with Trainer(config=config, plan=plan, optim=OptimConfig(lr=1e-3), device="cpu",
                     serial=True, nvme_dir=tmp_path / "nvme") as trainer:
            trainer.init_random(0)
            return [log.loss for log in trainer.fit(SyntheticTokens(VOCAB, SEQ, seed=1), 2)]

    expected = losses()
    real = trainer_module.HostState  # the runner takes its policy from the host state

    def host_state(blocks, device, policy, *args, **kwargs):
        return real(blocks, device, _InterpreterView(policy), *args, **kwargs)

    monkeypatch.setattr(trainer_module, "HostState", host_state)
    assert losses() == expected


def test_a_slot_off_its_placed_pool_is_refused_and_a_task_that_takes_one_must_name_one(
        tmp_path):
    plan = build_plan(spec_of(tiny_config("llama"), tmp_path),
                      TrainSpec(micro_batch=1, seq_len=SEQ, grad_accum=2),
                      Policy.of(moments_on_nvme=0.5, host_grad_buffers=2))
    placement = plan.placement
    assert placement.grad_landing == "pool" and placement.grad_sums == "host"
    for task in plan.tasks:  # the builder's slots (the optimizer steps, summed on the host,
        check_slot(task, placement)  # read no landing buffer and name none)

    def first(kind: TaskKind):
        return next(t for t in plan.tasks if t.kind == kind)

    count = placement.nvme_staging_slots
    for slot in (count, NO_SLOT):
        with pytest.raises(ValueError, match=f"slot {slot} is not one of the plan's {count} "
                                             "staging"):
            check_slot(replace(first(TaskKind.READ_STATE), slot=slot), placement)
    with pytest.raises(ValueError, match="slot -1 is not one of the plan's 2 landing"):
        check_slot(replace(first(TaskKind.ACCUMULATE_GRADS), slot=NO_SLOT), placement)
    # the GPU grad slots bound grads awaiting their offload: the executor allocates none
    check_slot(replace(first(TaskKind.BACKWARD), slot=99), placement)
