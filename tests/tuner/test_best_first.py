"""tune's best-first search: the same pick as the exhaustive one, bounds that hold, Ctrl-C."""

from dataclasses import replace

import pytest
from helpers import level_bounds, make_round_profile, make_tiny_model

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate
from layerslide.tuner import SearchSpace, plans, tune
from layerslide.tuner.bounds import gpu_in_use_lower_bound, short_plan_model
from layerslide.tuner.context import TuneContext
from layerslide.tuner.levels import Levels

TINY_SPACE = SearchSpace(windows=(1, 2), micro_batches=(1, 4), grad_accums=(1, 4),
                         accumulations=("layer_major",), activations=("gpu", "host"),
                         casts=("cpu_once", "gpu"))
# a 1B step-major and layer-major space on the H200 profile: a settled clock, niced kernels
# priced apart, GPU-updated blocks filling a capped GPU
H200_SPACE = SearchSpace(windows=(2,), micro_batches=(4, 16), grad_accums=(1, 4),
                         accumulations=("layer_major",), activations=("host",),
                         casts=("cpu_once", "gpu"))


def _pick(result):
    best = result.best
    return best.train, best.policy, best.prediction.tokens_per_s


@pytest.mark.parametrize("cap_mib", [None, 900])
def test_best_first_picks_what_the_exhaustive_search_picks_simulating_fewer(cap_mib):
    model, profile = make_tiny_model(num_layers=4), make_round_profile()
    cap = cap_mib * 2**20 if cap_mib else None
    fast = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1, gpu_memory_bytes=cap)
    full = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1, gpu_memory_bytes=cap,
                exhaustive=True)
    assert _pick(fast) == _pick(full)
    assert fast.searched == full.searched == len(list(TINY_SPACE.candidates(64, None,
                                                                            Policy.of())))
    # its number for its pick is what simulating its plan gives
    again = simulate(fast.best_plan, profile, gpu_memory_bytes=cap)
    assert again.tokens_per_s == pytest.approx(fast.best.prediction.tokens_per_s, rel=1e-12)


def test_best_first_on_a_settling_gpu_picks_as_the_exhaustive_search():
    model, profile = PRESETS["llama-3.2-1b"], load_profile("h200-bench")
    cap = 24 * 2**30
    fast = tune(model, profile, space=H200_SPACE, workers=1, gpu_memory_bytes=cap)
    full = tune(model, profile, space=H200_SPACE, workers=1, gpu_memory_bytes=cap,
                exhaustive=True)
    assert _pick(fast) == _pick(full)
    assert fast.best.prediction.gpu_speedup == full.best.prediction.gpu_speedup
    assert fast.bounded > 0 and len(fast.candidates) < len(full.candidates)


def test_every_bound_is_above_what_its_candidate_reaches():
    """Each level's bound on a candidate (class plans, short plan, after the sweep and after
    each later stage) is at least the tokens/s its later stages give it."""
    model, profile = PRESETS["llama-3.2-1b"], load_profile("h200-bench")
    levels = Levels(TuneContext(model=model, profile=profile, space=H200_SPACE,
                                gpu_memory_bytes=24 * 2**30, num_steps=3))
    for train, policy in H200_SPACE.candidates(1024, None, Policy.of()):
        assert levels.short_bound(train, policy)[1] is None  # none rejected unsimulated
        bounds, candidate = level_bounds(levels, train, policy)
        if candidate is None:
            continue
        reached = candidate.prediction.tokens_per_s
        assert all(b >= reached for b in bounds), (train, policy, bounds, reached)


def test_the_gpu_bound_of_a_plan_is_below_its_simulated_peak():
    model = PRESETS["llama-3.2-1b"]
    for train, policy in ((TrainSpec(micro_batch=8), Policy.of(activations="gpu")),
                          (TrainSpec(micro_batch=4, grad_accum=4),
                           Policy.of(accumulation="layer_major", window=4)),
                          (TrainSpec(micro_batch=2), Policy.of(cast="gpu"))):
        plan = build_plan(model, train, policy)
        held = gpu_in_use_lower_bound(plan)
        peak = simulate(plan, load_profile("h200-bench")).peak_bytes["gpu"]
        assert 0.5 * peak < held <= peak


@pytest.mark.parametrize("train, policy", [
    (TrainSpec(micro_batch=8, grad_accum=4), Policy.of(accumulation="layer_major", window=1)),
    (TrainSpec(micro_batch=2, grad_accum=16), Policy.of(accumulation="layer_major", window=4)),
    (TrainSpec(micro_batch=16), Policy.of(window=2, cast="gpu")),
    (TrainSpec(micro_batch=4, grad_accum=4), Policy.of(window=1)),
])
def test_the_deep_plans_gpu_bound_is_told_from_two_short_plans(train, policy):
    """Checkpoints kept on the GPU: the short plans' bound, carried to the model's depth, is
    the deep plan's exactly (a candidate over the GPU is rejected without its deep plan)."""
    model, policy = PRESETS["llama-3.1-8b"], policy.with_(activations="gpu")
    levels = Levels(TuneContext(model=model, profile=load_profile("h200-bench"),
                                space=H200_SPACE, gpu_memory_bytes=None, num_steps=3))
    short, whole = short_plan_model(model, policy)
    assert not whole
    told = levels._held_at_depth(plans.small_plan_of(short, train, policy), whole, train,
                                 policy)
    deep = gpu_in_use_lower_bound(build_plan(model, train, policy))
    assert told == deep > gpu_in_use_lower_bound(plans.small_plan_of(short, train, policy))


def test_ctrl_c_returns_the_best_found_so_far(monkeypatch):
    model, profile = make_tiny_model(num_layers=4), make_round_profile()
    simulate_plan, calls = plans.simulate, []

    def interrupted_after_three(*args, **kwargs):
        calls.append(args)
        if len(calls) > 3:
            raise KeyboardInterrupt  # Ctrl-C while the fourth plan is simulated
        return simulate_plan(*args, **kwargs)
    monkeypatch.setattr(plans, "simulate", interrupted_after_three)
    result = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1)
    assert result.interrupted
    assert 1 <= len(result.candidates) <= 3 < result.searched
    best = result.best
    assert best is not None and result.best_plan is not None
    assert best.prediction.tokens_per_s == max(c.prediction.tokens_per_s
                                               for c in result.feasible)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):  # a sweep of tunes stops as a whole
        tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1, interruptible=False)


def test_progress_counts_down_to_the_whole_space():
    seen = []
    result = tune(make_tiny_model(num_layers=4), make_round_profile(), seq_len=64,
                  space=TINY_SPACE, workers=1, progress=lambda done, total: seen.append(
                      (done, total)))
    assert seen[-1] == (result.searched, result.searched)
    assert all(done <= total for done, total in seen)


def test_a_tolerance_keeps_the_pick_within_it():
    model, profile = make_tiny_model(num_layers=4), make_round_profile()
    exact = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1)
    loose = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1, tolerance=0.05)
    assert loose.best.prediction.tokens_per_s >= exact.best.prediction.tokens_per_s / 1.05
    assert len(loose.candidates) <= len(exact.candidates)
    with pytest.raises(ValueError, match="tolerance"):
        tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1, tolerance=1.5)


def test_plans_that_differ_only_in_executor_knobs_are_built_once(monkeypatch):
    built = []
    real = plans.build_plan

    def counted(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(plans, "build_plan", counted)
    model, train = make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16)
    plain = plans.plan_of(model, train, Policy.of(), 3)
    niced = plans.plan_of(model, train, Policy.of(cpu_nice=19), 3)
    assert len(built) == 1 and niced.graph is plain.graph
    assert niced.policy.executor.cpu_nice == 19 and plain.policy.executor.cpu_nice == 0
    niced.meta["x"] = 1
    assert "x" not in plain.meta
    assert replace(plain, meta={}, policy=niced.policy) == replace(niced, meta={})


def test_a_fill_tries_only_the_blocks_worth_trying():
    """worth_trying(blocks) False skips that try and the fewer blocks of its order after it;
    True changes nothing."""
    from layerslide.tuner.stages import evaluate, filled_with_gpu_updates

    model = replace(make_tiny_model(num_layers=4), vocab_size=4096)
    train, profile = TrainSpec(micro_batch=1, seq_len=16), make_round_profile()
    roomy = evaluate(model, train, Policy.of(), profile, gpu_memory_bytes=None,
                     allow_nvme=True, num_steps=3)
    cap = roomy.prediction.gpu_need_bytes + int(18 * 4 * model.layer_params / 0.95)
    base = evaluate(model, train, Policy.of(), profile, gpu_memory_bytes=cap, allow_nvme=True,
                    num_steps=3)
    options = {"gpu_memory_bytes": cap, "num_steps": 3}
    filled = filled_with_gpu_updates(model, base, profile, **options)
    assert filled.policy.residency.gpu_updated_blocks > 0  # the fill pays here
    asked = []
    ruled_out = filled_with_gpu_updates(model, base, profile, **options,
                                        worth_trying=lambda b: asked.append(b) or False)
    assert ruled_out is base
    assert len(asked) == len(set(asked)) <= 2  # the first try of each order, no halving
    assert filled_with_gpu_updates(model, base, profile, **options,
                                   worth_trying=lambda b: True) == filled


def test_the_collector_is_paused_while_a_plan_is_simulated_and_left_as_it_was(monkeypatch):
    import gc

    seen = []
    simulate_plan = plans.simulate

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return simulate_plan(*args, **kwargs)
    monkeypatch.setattr(plans, "simulate", watched)
    model, profile = make_tiny_model(), make_round_profile()
    train = TrainSpec(micro_batch=1, seq_len=16)
    assert gc.isenabled()
    plans.simulated(model, train, Policy.of(), profile, gpu_memory_bytes=None, num_steps=3)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:  # a caller that turned it off keeps it off
        plans.simulated(model, train, Policy.of(window=2), profile, gpu_memory_bytes=None,
                        num_steps=3)
        assert not gc.isenabled()
    finally:
        gc.enable()
