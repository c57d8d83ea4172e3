"""benchmarks/validate_sim.py's CPU-side pieces: the profile at another AdamW rate, and the
measured AdamW-by-company read from a kept trace only where the trace is the row's run."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import validate_sim
from layerslide.hwprofiles import load_profile
from layerslide.planner.model import resolve_model
from layerslide.trace import Trace, TraceEvent


def test_at_adamw_rate_moves_the_compact_moments_and_the_memory_with_fp32():
    profile = load_profile("h200-bench")
    host = profile.host
    faster = validate_sim.at_adamw_rate(profile, 1.2 * host.adamw_params_per_s).host
    assert faster.adamw_params_per_s == pytest.approx(1.2 * host.adamw_params_per_s)
    assert faster.memory_bytes_per_s == pytest.approx(1.2 * host.memory_bytes_per_s)
    for field in ("adamw_bf16_params_per_s", "adamw_int8_params_per_s"):
        before = getattr(host, field)
        assert getattr(faster, field) == (None if before is None else pytest.approx(1.2 * before))


def trace_of(policy: dict, steps: int, layer_s: float) -> Trace:
    events = tuple(TraceEvent(task_id=f"a{s}", lane="cpu", kind="optimizer_step", block=0,
                              step=s, start_s=float(s), end_s=s + layer_s) for s in range(steps))
    return Trace(source="measured", label="r", events=events, meta={"policy": policy})


def test_company_is_read_from_the_rows_own_trace_and_not_from_another_run(tmp_path, capsys):
    spec = resolve_model("llama-3.2-1b")
    policy = {"residency": {"window": 2}}
    row = {"label": "r", "policy": policy, "warmup_step_times_s": [1.0],
           "step_times_s": [1.0] * 4}
    validate_sim.save_gz(trace_of(policy, 5, 0.5), tmp_path / "r.measured.json.gz")
    got = validate_sim.company_from_trace(tmp_path, row, spec)
    alone = got["measured_adamw_by_company"]["alone"]
    assert alone["tasks"] == 2  # past the warm-up step and two measured ones: trace steps 3, 4
    assert alone["params_per_s"] == pytest.approx(spec.layer_params / 0.5)
    # another policy, or another step count: another run's trace
    other = {**row, "policy": {"residency": {"window": 4}}}
    assert validate_sim.company_from_trace(tmp_path, other, spec) == {}
    longer = {**row, "step_times_s": [1.0] * 6}
    assert validate_sim.company_from_trace(tmp_path, longer, spec) == {}
    assert "is of another run" in capsys.readouterr().err
    assert validate_sim.company_from_trace(tmp_path, {**row, "label": "none"}, spec) == {}
    assert validate_sim.company_from_trace(tmp_path, {**row, "step_times_s": []}, spec) == {}


def test_a_row_runs_as_train_would_run_it_on_a_gpu():
    from layerslide.planner.settings import LANES_FIRST_NICE, Policy

    policy, cfg = Policy.of(window=2), validate_sim.CONFIGS["qwen4b-mb4x4-w2-host-lm"]
    niced = validate_sim.as_train_runs_it(policy, cfg, "gpu", "cuda")
    assert niced == policy.with_(cpu_nice=LANES_FIRST_NICE)
    assert validate_sim.as_train_runs_it(policy, cfg, "cpu", "cuda") is None  # CPU-bound
    assert validate_sim.as_train_runs_it(policy, cfg, "gpu", "cpu") is None  # no GPU
    for named in ("qwen4b-mb4x4-w2-host-lm-nice0", "qwen4b-mb4x4-w2-host-lm-nice10"):
        assert validate_sim.as_train_runs_it(policy, validate_sim.CONFIGS[named], "gpu",
                                             "cuda") is None  # the row names its niceness
    assert validate_sim.as_train_runs_it(policy, {"tuned": True}, "gpu", "cuda") is None


def test_adamw_measured_just_before_a_row_predicts_it_at_that_rate():
    profile = load_profile("h200-bench")
    rate = validate_sim.adamw_just_before(profile, 2**16)
    assert rate > 0
    spec = resolve_model("llama-3.2-1b")
    from layerslide.planner.settings import Policy, TrainSpec

    train, policy = TrainSpec(micro_batch=1, seq_len=256), Policy.of(window=2)
    slow = validate_sim.at_adamw_before(spec, train, policy, profile, 24 * 2**30,
                                        profile.host.adamw_params_per_s / 4)
    fast = validate_sim.at_adamw_before(spec, train, policy, profile, 24 * 2**30,
                                        profile.host.adamw_params_per_s)
    assert slow["adamw_before_params_per_s"] == profile.host.adamw_params_per_s / 4
    assert slow["predicted_step_s_at_adamw_before"] > fast["predicted_step_s_at_adamw_before"]


def test_rounds_merge_to_the_median_of_their_own_before_figures_and_are_judged_by_it():
    rounds = [{"label": "r", "config": {}, "measured_step_s": s, "measured_gpu_allocated_bytes": 1,
               "measured_gpu_reserved_bytes": 1, "measured_host_bytes": 1,
               "predicted_regime": "CPU", "adamw_before_params_per_s": a,
               "predicted_step_s_at_adamw_before": p}
              for s, a, p in ((1.00, 4e9, 1.10), (1.02, 5e9, 0.99), (0.98, 4.5e9, 1.01))]
    row = validate_sim.merged(rounds)
    assert row["predicted_step_s_at_adamw_before"] == 1.01
    assert row["adamw_before_params_per_s"] == 4.5e9
    (line,) = validate_sim.adamw_before_lines([row])
    assert "4.50-4.50 Gparam/s" in line and "+1.0%" in line and "within target: 1 of 1" in line
