"""GPU-bound plans run their CPU kernels niced (tuner.lanes_first), in tune and in train."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.kinds import Lane
from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.planner.settings import LANES_FIRST_NICE
from layerslide.simulator import simulate
from layerslide.training.plan_checks import with_lanes_first
from layerslide.training.run import RunConfig
from layerslide.tuner import SearchSpace, tune
from layerslide.tuner.lanes_first import lanes_first

TRAIN = TrainSpec(micro_batch=2, seq_len=16)
SPACE = SearchSpace(micro_batches=(2,), windows=(2,), grad_accums=(1,), activations=("host",),
                    casts=("cpu_once",), fill_gpu_updates=False)


def _profile(*, cpu_bound: bool, niced_price: bool = True):
    """Launches dear enough that the GPU lane sets the step beside an AdamW busy half of it,
    unless the AdamW is slower still; beside the CPU kernels a launch takes 4x as long, 1.2x
    beside niced ones."""
    base = make_round_profile(adamw_params_per_s=1e5 if cpu_bound else 2e6,
                              cast_bytes_per_s=1e15, kernel_launch_beside_kernels_s=2e-4,
                              kernel_launch_beside_niced_kernels_s=6e-5 if niced_price else None)
    sources = {**base.sources, "host.kernel_launch_beside_kernels": "a test",
               **({"host.kernel_launch_beside_niced_kernels": "a test"} if niced_price else {})}
    return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, kernel_launch_s=5e-5),
                               sources=sources)  # (a saved profile keeps sourced fields only)


def _prediction(profile, policy=None):
    plan = build_plan(make_tiny_model(num_layers=4), TRAIN, policy or Policy.of(window=2),
                      num_steps=3)
    return plan, simulate(plan, profile)


def test_only_a_gpu_bound_plan_left_at_nice_0_is_niced():
    gpu_bound = _prediction(_profile(cpu_bound=False))[1]
    cpu_bound = _prediction(_profile(cpu_bound=True))[1]
    assert (gpu_bound.bottleneck, cpu_bound.bottleneck) == (Lane.GPU, Lane.CPU)
    niced = lanes_first(Policy.of(window=2), gpu_bound.bottleneck)
    assert niced is not None and niced.executor.cpu_nice == LANES_FIRST_NICE
    assert niced.with_(cpu_nice=0) == Policy.of(window=2)  # nothing else changes
    assert lanes_first(Policy.of(window=2), cpu_bound.bottleneck) is None
    assert lanes_first(Policy.of(window=2, cpu_nice=5), gpu_bound.bottleneck) is None  # a chosen one stays


@pytest.mark.parametrize("niced_price", [True, False])
def test_tune_picks_a_gpu_bound_plan_niced_at_the_price_it_runs_at(niced_price, monkeypatch):
    from layerslide.tuner import plans

    profile = _profile(cpu_bound=False, niced_price=niced_price)
    simulated = []

    def counted(plan, *args, **kwargs):
        simulated.append(plan.policy.executor.lanes_first)
        return simulate(plan, *args, **kwargs)
    monkeypatch.setattr(plans, "simulate", counted)
    result = tune(make_tiny_model(num_layers=4), profile, seq_len=16, space=SPACE, workers=1)
    assert any(simulated) == niced_price  # a second simulation only where priced apart
    best = result.best
    assert best.policy.executor.lanes_first and result.best_plan.policy.executor.lanes_first
    plain = _prediction(profile, best.policy.with_(cpu_nice=0))[1]
    again = simulate(result.best_plan, profile)
    assert best.prediction.step_s == pytest.approx(again.step_s, rel=1e-12)
    if niced_price:  # faster than the same plan at nice 0
        assert best.prediction.step_s < plain.step_s / 1.01
    else:  # priced alike: no second simulation was needed
        assert best.prediction.step_s == pytest.approx(plain.step_s, rel=1e-12)


def test_tune_leaves_a_cpu_bound_plan_at_nice_0():
    result = tune(make_tiny_model(num_layers=4), _profile(cpu_bound=True), seq_len=16,
                  space=SPACE, workers=1)
    assert result.best.policy.executor.cpu_nice == 0


def test_tune_keeps_the_niceness_where_the_space_says_it_is_chosen():
    space = dataclasses.replace(SPACE, lanes_first=False)
    result = tune(make_tiny_model(num_layers=4), _profile(cpu_bound=False), seq_len=16,
                  space=space, workers=1)
    assert result.best.prediction.bottleneck == Lane.GPU
    assert result.best.policy.executor.cpu_nice == 0


def _lanes_first(config: RunConfig, profile, plan, prediction, device: str):
    """train's choice for a plan built from its settings (or a --plan file's)."""
    return with_lanes_first(config, plan, prediction, profile, device, say=print)


def test_train_nices_a_gpu_bound_plan_on_a_gpu_only_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LAYERSLIDE_CPU_NICE", raising=False)
    profile = _profile(cpu_bound=False)
    plan, prediction = _prediction(profile)
    config = RunConfig()
    niced, niced_prediction = _lanes_first(config, profile, plan, prediction, "cuda:0")
    assert niced.policy.executor.lanes_first and niced.tasks == plan.tasks
    assert niced_prediction.step_s < prediction.step_s / 1.01  # priced as it will run
    assert f"nice {LANES_FIRST_NICE}" in capsys.readouterr().out
    # where the profile prices niced launches like plain ones, no second simulation
    alike = _profile(cpu_bound=False, niced_price=False)
    plan_alike, prediction_alike = _prediction(alike)
    niced_alike, kept = _lanes_first(config, alike, plan_alike, prediction_alike, "cuda")
    assert niced_alike.policy.executor.lanes_first and kept is prediction_alike
    # on the CPU, with the niceness set by the environment (even to 0), or CPU-bound: as is
    assert _lanes_first(config, profile, plan, prediction, "cpu") == (plan, prediction)
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    assert _lanes_first(config, profile, plan, prediction, "cuda") == (plan, prediction)
    monkeypatch.delenv("LAYERSLIDE_CPU_NICE")
    from_file = RunConfig(plan="tuned.json")  # a plan file runs as it is
    assert _lanes_first(from_file, profile, plan, prediction, "cuda") == (plan, prediction)
    cpu_plan, cpu_prediction = _prediction(_profile(cpu_bound=True))
    assert _lanes_first(config, profile, cpu_plan, cpu_prediction, "cuda") == (
        cpu_plan, cpu_prediction)


def test_simulate_predicts_a_plan_built_from_flags_as_train_runs_it(tmp_path, capsys,
                                                                   monkeypatch):
    import json

    from layerslide.cli.main import main
    from layerslide.hwprofiles.writer import save_profile

    monkeypatch.delenv("LAYERSLIDE_CPU_NICE", raising=False)
    profile = save_profile(_profile(cpu_bound=False), tmp_path / "p.toml")
    model = make_tiny_model(num_layers=4)
    flags = ["simulate", "--model", str(_model_file(model, tmp_path)), "--profile", str(profile),
             "--micro-batch", "2", "--seq-len", "16", "--window", "2"]
    assert main(flags) == 0
    assert f"workers at nice {LANES_FIRST_NICE}" in capsys.readouterr().out
    assert main([*flags, "--json"]) == 0
    niced = json.loads(capsys.readouterr().out)["step_s"]
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    assert main([*flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] > niced * 1.01


def _model_file(model, tmp_path):
    from layerslide.executor.blocks import hf_config_from_spec

    path = tmp_path / "config.json"
    hf_config_from_spec(model).to_json_file(path)
    return path


def test_tune_writes_the_niceness_into_the_plan_unless_the_environment_sets_it(
        tmp_path, capsys, monkeypatch):
    from layerslide.cli.main import main
    from layerslide.hwprofiles.writer import save_profile
    from layerslide.planner import Plan

    profile = save_profile(_profile(cpu_bound=False), tmp_path / "p.toml")
    flags = ["tune", "--model", str(_model_file(make_tiny_model(num_layers=4), tmp_path)),
             "--profile", str(profile), "--seq-len", "16", "--windows", "2",
             "--micro-batches", "2", "--grad-accums", "1", "--activations", "host",
             "--casts", "cpu_once", "--no-gpu-updates"]
    monkeypatch.delenv("LAYERSLIDE_CPU_NICE", raising=False)
    assert main([*flags, "-o", str(tmp_path / "niced.json")]) == 0
    capsys.readouterr()
    assert Plan.load(tmp_path / "niced.json").policy.executor.cpu_nice == LANES_FIRST_NICE
    monkeypatch.setenv("LAYERSLIDE_CPU_NICE", "0")
    assert main([*flags, "-o", str(tmp_path / "chosen.json")]) == 0
    assert Plan.load(tmp_path / "chosen.json").policy.executor.cpu_nice == 0
