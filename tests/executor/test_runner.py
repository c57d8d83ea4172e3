import weakref

import pytest
import torch
from helpers import SEQ, VOCAB, spec_of, tiny_config

from layerslide.data.sources import SyntheticTokens
from layerslide.executor.device import LaneDevice
from layerslide.executor.optim import OptimConfig
from layerslide.executor.runner import TaskRunner, checkpoint_views
from layerslide.planner.build import build_plan
from layerslide.planner.plan import EMBEDDING
from layerslide.planner.settings import Policy, TrainSpec
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
