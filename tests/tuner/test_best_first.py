"""tune's best-first search: the same pick as the exhaustive one, bounds that hold, Ctrl-C."""

from dataclasses import replace

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner import search as S
from layerslide.tuner.bounds import gpu_in_use_lower_bound, tokens_per_s_bound

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
    context = S._Context(model=model, profile=profile, space=H200_SPACE,
                         gpu_memory_bytes=24 * 2**30, num_steps=3)
    S._use_context(context)
    for train, policy in H200_SPACE.candidates(1024, None, Policy.of()):
        bounds = [tokens_per_s_bound(train.tokens_per_step, S._class_bound(train, policy))]
        short, rejected = S._short_bound(train, policy)
        assert rejected is None
        bounds.append(short)
        candidate, later = S._sweep(train, policy)
        if not candidate.feasible:
            continue
        for stage in S.STAGES:
            if later is None:
                break
            bounds.append(later)
            candidate, later = S._stage(candidate, stage)
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


def test_ctrl_c_returns_the_best_found_so_far(monkeypatch):
    model, profile = make_tiny_model(num_layers=4), make_round_profile()
    sweep, calls = S._sweep, []

    def interrupted_after_three(*args):
        calls.append(args)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return sweep(*args)
    monkeypatch.setattr(S, "_sweep", interrupted_after_three)
    result = tune(model, profile, seq_len=64, space=TINY_SPACE, workers=1)
    assert result.interrupted and len(result.candidates) == 3
    assert result.best is not None and result.best_plan is not None
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
    real = S.build_plan

    def counted(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(S, "build_plan", counted)
    model, train = make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16)
    plain = S._plan(model, train, Policy.of(), 3)
    niced = S._plan(model, train, Policy.of(cpu_nice=19), 3)
    assert len(built) == 1 and niced.graph is plain.graph
    assert niced.policy.executor.cpu_nice == 19 and plain.policy.executor.cpu_nice == 0
    niced.meta["x"] = 1
    assert "x" not in plain.meta
    assert replace(plain, meta={}, policy=niced.policy) == replace(niced, meta={})
