"""Non-finite grads on several ranks: a block whose summed grads are non-finite in any rank's
slice is skipped by every rank, as one rank skips it whole (without clipping, the check is
per block)."""

from __future__ import annotations

import pytest
import torch
from helpers import SEQ, spec_of, tiny_config
from ranks_harness import OPTIM, TrainJob, spawn, train

from layerslide.planner.build import build_plan
from layerslide.planner.settings import Policy, TrainSpec

POISONED = (0, 0, 1)  # (step, block, rank): rank 1's grads of layer 0 at step 0 get an inf


def poisoned(ranks, job):
    """train(), with an inf written into the first element of one rank's flat grads of one
    block: an element of rank 0's slice of the sum."""
    from layerslide.executor import rank_tasks

    step, block, rank = POISONED
    flat_grads = rank_tasks.RankTasks._flat_grads

    def with_inf(self, key, lane):
        flat = flat_grads(self, key, lane)
        if ranks.rank == rank and key[0] == step and key[2] == block:
            flat[0] = float("inf")
        return flat

    rank_tasks.RankTasks._flat_grads = with_inf
    return train(ranks, job)


@pytest.mark.parametrize("accumulation", ["step_major", "layer_major"])
def test_every_rank_skips_a_block_non_finite_in_one_ranks_slice(tmp_path, accumulation):
    config = tiny_config("llama")
    plan = build_plan(spec_of(config, tmp_path / "model"),
                      TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=2, gpus=2),
                      Policy.of(accumulation=accumulation))
    plan.save(tmp_path / "plan.json")
    job = TrainJob(out=str(tmp_path / "out"), plan=str(tmp_path / "plan.json"), config=config,
                   optim=OPTIM, steps=1)
    ranks = spawn(poisoned, job, gpus=2)
    step, block, _ = POISONED
    for r in ranks:  # every rank skipped the block, and only it: its slices are as they were
        assert r["skipped_blocks"][step] == (block,)
        assert torch.equal(r["owned"][block], r["owned_at_start"][block])
        assert not torch.equal(r["owned"][block + 1], r["owned_at_start"][block + 1])
