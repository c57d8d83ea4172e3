"""The checks of a plan against this machine: check_fits on the GPU and on the CPU."""

from __future__ import annotations

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
