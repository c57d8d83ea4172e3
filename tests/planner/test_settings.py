"""TrainSpec and Policy validation: bad values are refused with what to change."""

import pytest

from layerslide.planner import Policy, TrainSpec
from layerslide.planner.settings import ExecutorKnobs


@pytest.mark.parametrize("kwargs, match", [
    ({"micro_batch": 0}, "micro_batch"),
    ({"seq_len": -1}, "seq_len"),
    ({"grad_accum": 1.5}, "grad_accum"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ({"max_grad_norm": float("inf")}, "finite"),  # never clips, yet every update would wait
    ({"max_grad_norm": float("nan")}, "finite"),
])
def test_train_spec_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainSpec(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 0}, "window"),
    ({"window": 2, "prefetch_depth": 3}, "cannot exceed window"),
    ({"activations": "disk"}, "gpu, host, nvme"),
    ({"optimizer_order": "random"}, "arrival, deadline"),
    ({"moments_on_nvme": 1.5}, "fraction"),
    ({"cast": "gpu", "master_on_nvme": 0.5}, "master_on_nvme=0"),
    ({"resident_layers": -1}, "resident_layers"),
    ({"stream_run_ahead": -1}, "stream_run_ahead"),
    ({"head_chunk_bytes": 1000}, "head_chunk_bytes.*>= 1 MiB"),
    ({"head_chunk_bytes": 2.0**30}, "whole number of bytes"),
    ({"moment_precision": "fp16"}, "fp32, bf16, int8"),
    ({"moment_precision": "bf16", "cpu_optimizer": "torch"}, "cpu_optimizer=native"),
])
def test_policy_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Policy.of(**kwargs)


def test_round_trips_and_unknown_fields():
    policy = Policy.of(window=4, activations="gpu", moments_on_nvme=0.25)
    assert Policy.from_dict(policy.to_dict()) == policy
    train = TrainSpec(micro_batch=4, grad_accum=2, max_grad_norm=1.0)
    assert TrainSpec.from_dict(train.to_dict()) == train
    assert train.tokens_per_step == 4 * 1024 * 2
    with pytest.raises(ValueError, match="unknown policy fields"):
        Policy.from_dict({"windw": 2})


def test_a_saved_policy_naming_a_removed_field_loads_and_says_what_it_ignores():
    import warnings

    saved = Policy.of(window=4).to_dict()
    saved["executor"]["cpu_sched"] = "normal"  # what runs now anyway: dropped silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Policy.from_dict(saved) == Policy.of(window=4)
    saved["executor"]["cpu_sched"] = "batch"
    with pytest.warns(UserWarning, match="executor.cpu_sched='batch' is ignored.*'normal'"):
        assert Policy.from_dict(saved) == Policy.of(window=4)
    with pytest.warns(UserWarning, match="LAYERSLIDE_CPU_SCHED is ignored"):
        assert ExecutorKnobs.env_settings({"LAYERSLIDE_CPU_SCHED": "batch"}) == {}
    del saved["executor"]["cpu_sched"]
    saved["executor"]["cpu_schedule"] = "batch"  # never a field: refused as before
    with pytest.raises(ValueError, match="unknown policy fields"):
        Policy.from_dict(saved)


def test_what_a_policy_keeps_on_nvme_and_whether_it_casts_on_the_cpu():
    assert not Policy.of().residency.uses_nvme
    assert Policy.of(activations="nvme").residency.uses_nvme
    assert not Policy.of(activations="nvme").residency.state_on_nvme
    assert Policy.of(moments_on_nvme=0.5).residency.state_on_nvme
    assert not Policy.of().cpu_casts  # the native optimizer writes the bf16 copy itself
    assert Policy.of(cast="cpu_per_load").cpu_casts and not Policy.of(cast="gpu").cpu_casts
    assert Policy.of(cpu_optimizer="torch").cpu_casts


def test_every_field_is_a_flag_or_named_with_what_sets_it():
    from dataclasses import fields

    from layerslide.planner.settings import (
        FROM_ENVIRONMENT,
        NOT_ON_COMMAND_LINE,
        POLICY_GROUPS,
        doc_of,
        flag_fields,
        policy_flag_fields,
    )

    every = [f.name for cls in (TrainSpec, *POLICY_GROUPS.values()) for f in fields(cls)]
    flags = [f.name for f in (*flag_fields(TrainSpec), *policy_flag_fields())]
    assert sorted(flags + [*FROM_ENVIRONMENT] + [*NOT_ON_COMMAND_LINE]) == sorted(every)
    assert set(flags).isdisjoint(FROM_ENVIRONMENT) and set(flags).isdisjoint(NOT_ON_COMMAND_LINE)
    assert {f.name for f in fields(ExecutorKnobs)} <= set(FROM_ENVIRONMENT)  # as its doc says
    assert "stream_run_ahead" in FROM_ENVIRONMENT and "window" in flags
    assert [f.name for f in flag_fields(TrainSpec)] == [
        "micro_batch", "seq_len", "grad_accum", "max_grad_norm", "gpus", "hosts"]
    assert all(doc_of(f) for f in (*flag_fields(TrainSpec), *policy_flag_fields()))


def test_the_environment_sets_each_field_by_its_variable():
    from layerslide.planner.settings import FROM_ENVIRONMENT, run_ahead_from_env

    values = {"cpu_threads": "3", "cpu_chunk_elements": "4096", "cpu_nice": "19",
              "lane_switch_interval_s": "0.001", "lane_waits": "watch", "stream_run_ahead": "0"}
    environ = {FROM_ENVIRONMENT[name]: raw for name, raw in values.items()}
    assert ExecutorKnobs.env_settings(environ) == {
        "cpu_threads": 3, "cpu_chunk_elements": 4096, "cpu_nice": 19,
        "lane_switch_interval_s": 0.001, "lane_waits": "watch"}
    assert run_ahead_from_env(3, environ) == 0 and run_ahead_from_env(3, {}) == 3
    with pytest.raises(ValueError, match="LAYERSLIDE_CPU_CHUNK='x': must be a whole number"):
        ExecutorKnobs.env_settings({"LAYERSLIDE_CPU_CHUNK": "x"})
    with pytest.raises(ValueError, match="LAYERSLIDE_LANE_SWITCH_INTERVAL_S='x'.*seconds"):
        ExecutorKnobs.env_settings({"LAYERSLIDE_LANE_SWITCH_INTERVAL_S": "x"})
    with pytest.raises(ValueError, match="lane_waits=.spin.: choose one of poll, watch"):
        ExecutorKnobs.env_settings({"LAYERSLIDE_LANE_WAITS": "spin"})
