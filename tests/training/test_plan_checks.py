"""The checks of a plan against this machine: check_fits on the GPU and on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import make_tiny_model

from layerslide.hwprofiles import resolve_profile
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.training import plan_checks
from layerslide.training.run import RunError

GIB = 1024**3


def test_on_the_cpu_the_plans_gpu_share_counts_as_host_memory(monkeypatch):
    # a micro-batch whose activations overflow RAM only once they are RAM too (--device cpu)
    plan = build_repeatable_plan(make_tiny_model(), TrainSpec(micro_batch=100_000, seq_len=16),
                                 Policy.of())
    profile = resolve_profile("h200-bench")
    prediction = plan_checks.check_fits(plan, profile, None, warn=False)  # a GPU's: it fits
    host = prediction.peak_bytes["host"]
    gpu = prediction.gpu_allocated_peak_bytes
    assert gpu > GIB  # what the test is about: a GPU share larger than the margin below
    monkeypatch.setattr("layerslide.calibrate.host.physical_ram_bytes",
                        lambda: host + gpu // 2)
    assert plan_checks.check_fits(plan, profile, None, warn=False) is not None
    with pytest.raises(RunError) as refused:
        plan_checks.check_fits(plan, profile, None, warn=False, on_cpu=True)
    message = str(refused.value)
    assert f"{(host + gpu) / GIB:.1f} GiB of host memory at its peak ({gpu / GIB:.1f} GiB of it the " \
           "GPU's share, which --device cpu keeps in RAM)" in message
    assert "lower --micro-batch or --seq-len" in message


def two_rank_plan():
    return build_repeatable_plan(make_tiny_model(), TrainSpec(micro_batch=2, seq_len=16, gpus=2),
                                 Policy.of())


def test_a_host_must_hold_every_one_of_its_ranks(monkeypatch):
    # the plan is one rank's: its host bytes (the rank's slices, its peak) count once per rank
    per_rank = 3 * GIB
    predicted = SimpleNamespace(gpu_need_bytes=0, gpu_allocated_peak_bytes=0,
                                peak_bytes={"host": per_rank})
    monkeypatch.setattr("layerslide.simulator.predict.simulate", lambda *a, **k: predicted)
    monkeypatch.setattr("layerslide.calibrate.host.physical_ram_bytes",
                        lambda: per_rank * 3 // 2)
    profile = resolve_profile("h200-bench")
    one = build_repeatable_plan(make_tiny_model(), TrainSpec(micro_batch=2, seq_len=16),
                                Policy.of())
    assert plan_checks.check_fits(one, profile, None, warn=False) is predicted
    with pytest.raises(RunError) as refused:
        plan_checks.check_fits(two_rank_plan(), profile, None, warn=False)
    assert ("the plan needs 6.0 GiB of host memory at its peak for its 2 ranks on this host, "
            "3.0 GiB each, this machine has 4.5 GiB") in str(refused.value)
    assert "or run fewer ranks on this host (2 now)" in str(refused.value)


def test_a_two_rank_plans_prediction_is_checked_against_ram_for_both(monkeypatch):
    plan, (profile, _) = two_rank_plan(), resolve_profile("h200-bench").with_ranks(2, 1)
    per_rank = plan_checks.check_fits(plan, profile, None, warn=False).peak_bytes["host"]
    per_rank = max(per_rank, plan.static_bytes("host"))
    monkeypatch.setattr("layerslide.calibrate.host.physical_ram_bytes",
                        lambda: per_rank * 3 // 2)
    with pytest.raises(RunError, match="for its 2 ranks on this host"):
        plan_checks.check_fits(plan, profile, None, warn=False)
