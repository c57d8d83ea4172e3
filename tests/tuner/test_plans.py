"""The tuner's plans and simulations: a candidate whose plan holds more on the GPU at once than
the GPU has is rejected without its simulation, and only such a one."""

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, simulate
from layerslide.tuner import plans
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
