"""tune and what-if over several GPUs and hosts: one rank tuned on its share of the host."""

from dataclasses import replace

import pytest
from helpers import level_bounds, make_round_host, make_round_profile, make_tiny_model

from layerslide.planner import Policy
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.context import TuneContext
from layerslide.tuner.levels import Levels
from layerslide.tuner.whatif import across_ranks, rank_counts, speedups

SPACE = SearchSpace(windows=(1, 2), micro_batches=(1, 4), grad_accums=(1, 4),
                    accumulations=("layer_major",), activations=("gpu", "host"),
                    casts=("cpu_once", "gpu"))


def _pick(result):
    best = result.best
    return best.train, best.policy, best.prediction.tokens_per_s


@pytest.mark.parametrize(("gpus", "hosts"), [(2, 1), (4, 1), (2, 2)])
def test_best_first_picks_what_the_exhaustive_search_picks_on_several_ranks(gpus, hosts):
    model, host = make_tiny_model(num_layers=4), make_round_host(gpus=4)
    fast = tune(model, host, seq_len=64, space=SPACE, workers=1, gpus=gpus, hosts=hosts)
    full = tune(model, host, seq_len=64, space=SPACE, workers=1, gpus=gpus, hosts=hosts,
                exhaustive=True)
    assert _pick(fast) == _pick(full)
    train = fast.best.train
    assert (train.gpus, train.hosts) == (gpus, hosts)
    assert fast.best_plan.placement.gpus == gpus and fast.best_plan.placement.hosts == hosts
    # tokens/s are every rank's
    assert fast.best.prediction.tokens_per_step == train.tokens_per_step * gpus * hosts


def test_every_bound_holds_on_several_ranks():
    """Each level's bound on a candidate of 2 ranks is at least what its stages give it."""
    model, host = make_tiny_model(num_layers=4), make_round_host(gpus=2)
    levels = Levels(TuneContext(model=model, profile=host, space=SPACE, gpu_memory_bytes=None,
                                num_steps=3, gpus=2))
    checked = 0
    for train, policy in SPACE.candidates(64, None, Policy.of(), gpus=2):
        bounds, candidate = level_bounds(levels, train, policy)
        if candidate is None:
            continue
        assert all(b >= candidate.prediction.tokens_per_s for b in bounds), (train, bounds)
        checked += 1
    assert checked > 0


def test_more_ranks_of_a_gpu_bound_plan_are_faster():
    """A host whose CPU outruns its GPUs: each rank's GPU bounds it, and four of them train
    about four times as fast as one (a little more: each rank's GPU handles only its slice of
    the loads' and offloads' work, the collectives take a little)."""
    model = make_tiny_model(num_layers=4)
    host = make_round_host(gpus=4, adamw_params_per_s=1e12, cast_bytes_per_s=1e13)
    space = replace(SPACE, fill_gpu_updates=False)
    one, four = (tune(model, host, seq_len=64, space=space, workers=1, gpus=g,
                      with_plan=False).best for g in (1, 4))
    assert one.prediction.bound == four.prediction.bound == "GPU compute"
    assert 3.5 < four.prediction.tokens_per_s / one.prediction.tokens_per_s < 4.5


def test_the_token_cap_counts_every_rank():
    space = SearchSpace(windows=(1,), micro_batches=(1, 4), grad_accums=(1, 4),
                        accumulations=("layer_major",), max_tokens_per_step=4 * 64)
    one = {t.tokens_per_step for t, _ in space.candidates(64, None, Policy.of())}
    four = [t for t, _ in space.candidates(64, None, Policy.of(), gpus=4)]
    assert max(one) == 4 * 64
    assert {(t.micro_batch, t.grad_accum) for t in four} == {(1, 1)}
    with pytest.raises(ValueError, match="over 8 ranks.*or fewer ranks"):
        tune(make_tiny_model(num_layers=2), make_round_host(gpus=8), seq_len=64, space=space,
             gpus=8)


def test_no_block_is_updated_on_the_gpu_with_several_ranks():
    model, host = make_tiny_model(num_layers=4), make_round_host(gpus=2)
    single = tune(model, host, seq_len=64, space=SPACE, workers=1, gpus=1, with_plan=False)
    assert single.best.policy.residency.gpu_updated_blocks > 0  # the fill is taken on one
    result = tune(model, host, seq_len=64, space=SPACE, workers=1, gpus=2, with_plan=False)
    assert all(c.policy.residency.gpu_updated_blocks == 0 for c in result.candidates)


def test_ranks_the_profile_cannot_hold_are_refused_before_any_work():
    model = make_tiny_model(num_layers=2)
    with pytest.raises(ValueError, match="holds 1.*--gpus 1 or fewer"):
        tune(model, make_round_profile(), seq_len=64, space=SPACE, gpus=2)
    with pytest.raises(ValueError, match=r"no \[network\]"):
        tune(model, make_round_host(gpus=2, network=None), seq_len=64, space=SPACE, hosts=2)


def test_whatif_across_ranks_says_what_each_profile_cannot_hold():
    two, four = make_round_host(gpus=2), make_round_host(gpus=4, network=None)
    four = four.__class__(**{**four.__dict__, "name": "round4"})
    placed, skipped = rank_counts([two, four], (1, 2, 4), (1, 2))
    assert [(p.name, g, h) for p, g, h in placed] == [
        (two.name, 1, 1), (two.name, 2, 1), (two.name, 1, 2), (two.name, 2, 2),
        ("round4", 1, 1), ("round4", 2, 1), ("round4", 4, 1)]
    assert skipped == [f"{two.name} holds 2 GPUs: 4 not tried",
                       "round4 has no [network] between hosts: 2 hosts not tried"]


def test_whatif_rows_on_several_ranks_and_their_speedups():
    model, host = make_tiny_model(num_layers=4), make_round_host(gpus=2)
    rows = across_ranks(model, [(host, 1, 1), (host, 2, 1)], seq_len=64, space=SPACE,
                        workers=1)
    assert [(r.gpus, r.hosts) for r in rows] == [(1, 1), (2, 1)]
    table = [r.row() for r in rows]
    assert [t["gpus"] for t in table] == [1, 2] and all(t["bound"] for t in table)
    ratio = speedups(rows)
    assert ratio[0] == 1.0
    assert ratio[1] == pytest.approx(table[1]["tokens_per_s"] / table[0]["tokens_per_s"])
    # the host's memory is per host (both ranks'), the GPU's per GPU
    best = rows[1].result.best.prediction
    assert table[1]["peak_host_bytes"] == 2 * best.peak_bytes["host"]
    assert table[1]["peak_gpu_bytes"] == best.peak_bytes["gpu"]


def test_several_ranks_are_tried_at_the_global_batches_of_one_gpu():
    """Each accumulation divided by the ranks is tried too: under a cap on every rank's
    tokens, N ranks reach the global batch one GPU is tuned at (64 sequences: 16 x 4 on one,
    16 x 2 on each of two)."""
    space = SearchSpace(windows=(1,), micro_batches=(16,), grad_accums=(1, 4),
                        accumulations=("layer_major",), activations=("gpu",),
                        casts=("cpu_once",), max_tokens_per_step=64 * 64)
    assert space.rank_accums(1) == (1, 4) and space.rank_accums(2) == (1, 2, 4)
    assert space.rank_accums(8) == (1, 4)
    biggest = max(t.global_tokens_per_step
                  for t, _ in space.candidates(64, None, Policy.of(), gpus=2))
    assert biggest == max(t.tokens_per_step for t, _ in space.candidates(64, None, Policy.of()))
