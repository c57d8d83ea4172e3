"""The tuner's plans and simulations: a candidate whose plan holds more on the GPU at once than
the GPU has is rejected without its simulation, and only such a one."""

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, simulate
from layerslide.tuner import SearchSpace, plans, tune
from layerslide.tuner.bounds import gpu_in_use_lower_bound

MODEL = PRESETS["llama-3.2-1b"]
# every layer's checkpoints of 4 micro-batches kept on the GPU: several GiB at once
TRAIN = TrainSpec(micro_batch=8, grad_accum=4)
POLICY = Policy.of(accumulation="layer_major", activations="gpu", window=2)


def _predicted(profile, cap: int, monkeypatch) -> tuple:
    simulated = []

    def counted(plan, *args, **kwargs):
        simulated.append(plan)
        return simulate(plan, *args, **kwargs)
    monkeypatch.setattr(plans, "simulate", counted)
    prediction = plans.predicted(MODEL, TRAIN, POLICY, profile, gpu_memory_bytes=cap,
                                 num_steps=3, costs=CostModel(profile), settle_clock=True)
    return prediction, simulated


def test_a_plan_holding_more_than_the_gpu_at_once_is_rejected_unsimulated(monkeypatch):
    profile = load_profile("h200-bench")
    held = gpu_in_use_lower_bound(build_plan(MODEL, TRAIN, POLICY))
    cap = int(held * 0.9)
    prediction, simulated = _predicted(profile, cap, monkeypatch)
    assert not simulated
    assert [(o.tier, o.need_bytes, o.limit_bytes) for o in prediction.overflows] == [
        ("gpu", held, cap)]
    assert not prediction.simulated and "gpu needs" in prediction.reason
    # the simulation it was spared overflows the GPU too, needing at least what it was told
    full = simulate(build_plan(MODEL, TRAIN, POLICY), profile, gpu_memory_bytes=cap)
    assert [o.tier for o in full.overflows] == ["gpu"]
    assert full.gpu_need_bytes >= held


def test_a_plan_within_the_gpu_is_simulated(monkeypatch):
    profile = load_profile("h200-bench")
    held = gpu_in_use_lower_bound(build_plan(MODEL, TRAIN, POLICY))
    prediction, simulated = _predicted(profile, held, monkeypatch)
    assert len(simulated) == 1 and prediction.simulated


def test_the_plans_a_search_builds_unchecked_are_valid(monkeypatch):
    """tune leaves Plan.validate out of its builds (tuner.plans): every plan a small search
    builds, deep and short, must pass it."""
    built = []

    def unchecked(*args, **kwargs):
        assert kwargs.pop("validate") is False
        plan = build_plan(*args, validate=False, **kwargs)
        built.append(plan)
        return plan
    monkeypatch.setattr(plans, "build_plan", unchecked)
    plans._PLANS.clear()
    plans._SMALL_PLANS.clear()
    space = SearchSpace(windows=(1, 2), micro_batches=(4, 16), grad_accums=(1, 4),
                        accumulations=("layer_major",), activations=("gpu", "host"),
                        casts=("cpu_once", "gpu"))
    result = tune(MODEL, load_profile("h200-bench"), space=space, workers=1,
                  gpu_memory_bytes=24 * 2**30)
    assert result.best_plan is not None
    assert {p.num_steps for p in built} == {2, 3}
    for plan in built:
        plan.validate()


def test_the_plan_cache_keeps_plans_past_its_size_while_they_hold_few_tasks(monkeypatch):
    """A search meets a candidate's plan again ~100 plans on (its settled clock after every
    leader's fill): plans past PLAN_CACHE_SIZE are kept while they hold at most MEMO_TASKS."""
    plans._PLANS.clear()
    monkeypatch.setattr(plans, "PLAN_CACHE_SIZE", 2)
    monkeypatch.setattr(plans, "MEMO_TASKS", 0)
    policies = [POLICY.with_(window=w) for w in (1, 2, 3, 4)]
    tasks = [len(plans.plan_of(MODEL, TRAIN, p, num_steps=2).graph) for p in policies]
    assert len(plans._PLANS) == 2
    plans._PLANS.clear()
    monkeypatch.setattr(plans, "MEMO_TASKS", sum(tasks))
    for p in policies:
        plans.plan_of(MODEL, TRAIN, p, num_steps=2)
    assert len(plans._PLANS) == 4
    plans.plan_of(MODEL, TRAIN, POLICY.with_(window=5), num_steps=2)
    assert 2 <= len(plans._PLANS) < 5
    assert sum(len(plan.graph) for plan in plans._PLANS.values()) <= sum(tasks)
    plans._PLANS.clear()
