"""Prediction fields: throughput, MFU, bottleneck, lane busy fractions, summary, and the
optimizer order's effect on a CPU-bound plan."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, simulate
from layerslide.simulator.predict import gpu_compute_busy
from layerslide.trace import TIERS

# Round profile with a CPU and cast so fast that the GPU is what limits the step.
FAST_HOST = {"adamw_params_per_s": 1e12, "cast_bytes_per_s": 1e15}


@pytest.fixture(scope="module")
def cpu_bound():
    plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                      num_steps=3)
    profile = make_round_profile()
    return plan, profile, simulate(plan, profile, label="cpu-bound")


@pytest.fixture(scope="module")
def gpu_bound():
    plan = build_plan(make_tiny_model(6), TrainSpec(micro_batch=8, seq_len=256), Policy.of(),
                      num_steps=3)
    profile = make_round_profile(**FAST_HOST)
    return plan, profile, simulate(plan, profile)


@pytest.fixture(params=["cpu_bound", "gpu_bound"])
def predicted(request):
    return request.getfixturevalue(request.param)


def test_throughput_fields_follow_from_step_time(predicted):
    plan, profile, p = predicted
    assert p.feasible
    assert p.tokens_per_step == plan.train.tokens_per_step
    assert p.tokens_per_s == pytest.approx(p.tokens_per_step / p.step_s, rel=1e-12)
    flops_per_token = plan.model.training_flops_per_token(plan.train.seq_len)
    assert p.model_flops_per_s == pytest.approx(flops_per_token * p.tokens_per_step / p.step_s,
                                                rel=1e-12)
    assert p.mfu == pytest.approx(p.model_flops_per_s / profile.gpu.bf16_flops_per_s, rel=1e-12)
    assert 0 < p.mfu < 1
    ends = {e.task_id: e.end_s for e in p.trace.events}
    markers = [ends[f"s{s}.m0.backward.emb"] for s in range(plan.num_steps)]
    last_cycle = markers[-1] - markers[-2]
    mean_cycle = (markers[-1] - markers[0]) / (plan.num_steps - 1)
    assert p.step_s == max(last_cycle, mean_cycle)
    assert p.limits_bytes == {"gpu": profile.gpu.memory_bytes, "host": profile.host.ram_bytes,
                              "nvme": profile.storage.capacity_bytes}


def test_tiny_numbers_by_hand(cpu_bound):
    plan, _, p = cpu_bound
    # 16 tokens per step; 3 * (2 layers * 77824 + 2*64*256) = 565248 FLOPs per token
    assert p.tokens_per_step == 16
    assert plan.model.training_flops_per_token(16) == 3 * (2 * 77824 + 2 * 64 * 256) == 565248
    assert p.mfu == pytest.approx(565248 * 16 / p.step_s / 1e12, rel=1e-12)


def test_lane_busy_fractions(predicted):
    _, _, p = predicted
    assert set(p.lane_busy) == set(p.trace.lanes)
    assert all(0.0 <= busy <= 1.0 + 1e-12 for busy in p.lane_busy.values())
    assert p.bottleneck == max(p.lane_busy, key=p.lane_busy.get)


def _busy_from_events(trace, start_s: float, end_s: float) -> dict[str, float]:
    """Each lane's busy fraction of the window, summed over the trace's events in their order
    (what the run's spans must give: the search's simulations keep no events)."""
    busy = dict.fromkeys(trace.lanes, 0.0)
    for e in trace.events:
        overlap = min(e.end_s, end_s) - max(e.start_s, start_s)
        if overlap > 0:
            busy[e.lane] += overlap
    return {lane: value / (end_s - start_s) for lane, value in busy.items()}


def test_lane_busy_from_the_spans_is_the_events_own_in_their_lanes_order(predicted):
    plan, profile, p = predicted
    ends = {e.task_id: e.end_s for e in p.trace.events}
    markers = [ends[t] for t in plan.meta["step_markers"]]
    last, mean = markers[-1] - markers[-2], (markers[-1] - markers[0]) / (len(markers) - 1)
    start = markers[-2] if last >= mean else markers[0]
    expected = _busy_from_events(p.trace, start, markers[-1])
    assert list(p.lane_busy.items()) == list(expected.items())
    untraced = simulate(plan, profile, keep_trace=False)
    assert untraced.trace is None
    assert list(untraced.lane_busy.items()) == list(expected.items())
    assert untraced.step_s == p.step_s


def test_bottleneck_is_the_cpu_on_a_slow_host(cpu_bound):
    plan, profile, p = cpu_bound
    assert p.bottleneck == "cpu"
    assert p.lane_busy["cpu"] > 0.99
    costs = CostModel(profile)
    cpu_solo_s = sum(costs.cost(t).solo_s for t in plan.tasks if t.lane == "cpu" and t.step == 0)
    gpu_solo_s = sum(costs.cost(t).solo_s for t in plan.tasks if t.lane == "gpu" and t.step == 0)
    assert cpu_solo_s > 1000 * gpu_solo_s
    # steady state: no faster than the CPU's work per step, and the GPU hides in its gaps
    assert cpu_solo_s <= p.step_s < 1.01 * cpu_solo_s


def test_bottleneck_is_the_gpu_with_a_fast_host(gpu_bound):
    plan, profile, p = gpu_bound
    assert p.bottleneck == "gpu"
    assert p.lane_busy["gpu"] > 0.9
    costs = CostModel(profile)
    per_lane: dict[str, float] = {}
    for t in plan.tasks:
        if t.step == 1:
            per_lane[t.lane] = per_lane.get(t.lane, 0.0) + costs.cost(t).solo_s
    # really GPU-bound: the GPU has the most work, and the step is close to it
    assert max(per_lane, key=per_lane.get) == "gpu"
    assert per_lane["gpu"] <= p.step_s * (1 + 1e-9) <= 1.1 * per_lane["gpu"]
    assert p.mfu > 0.5  # 1e12 FLOP/s at efficiency 1; recompute costs the rest


def test_summary_is_json_and_matches_fields(cpu_bound):
    plan, _, p = cpu_bound
    summary = json.loads(json.dumps(p.summary()))
    assert summary["label"] == "cpu-bound"
    assert summary["feasible"] is True and summary["reason"] == ""
    assert summary["step_s"] == p.step_s
    assert summary["tokens_per_s"] == p.tokens_per_s
    assert summary["bottleneck"] == "cpu"
    assert summary["lane_busy"] == p.lane_busy
    for tier in TIERS:
        assert summary[f"peak_{tier}_bytes"] == p.peak_bytes[tier]
        assert summary[f"limit_{tier}_bytes"] == p.limits_bytes[tier]
    assert "trace" not in summary
    assert summary["gpu_need_bytes"] == p.gpu_need_bytes > 0
    assert summary["gpu_reserved_bytes"] == p.gpu_reserved_bytes > 0
    # what max_memory_allocated measures: the held count, at most the bytes in use without the
    # runtime, below the reserve
    assert summary["gpu_allocated_peak_bytes"] == p.gpu_held_peak_bytes > 0
    assert (summary["gpu_allocated_peak_bytes"] + summary["gpu_runtime_bytes"]
            <= p.peak_bytes["gpu"])
    assert summary["gpu_allocated_peak_bytes"] <= summary["gpu_reserved_bytes"]
    rejected = simulate(plan, make_round_profile(), gpu_memory_bytes=1)
    summary = json.loads(json.dumps(rejected.summary()))
    assert summary["feasible"] is False and summary["step_s"] is None
    assert summary["gpu_need_bytes"] is None  # rejected before simulating: nothing modelled
    assert summary["reason"].startswith("gpu needs")


def test_trace_is_labelled(cpu_bound):
    plan, _, p = cpu_bound
    assert p.trace.source == "simulated"
    assert p.trace.label == "cpu-bound"
    assert p.trace.meta["profile"] == "round"
    # the engine's GPU pools ride on the trace: the static one, and each lane that allocates
    assert set(p.trace.meta["gpu_pool_peak_bytes"]) == {"static", "gpu", "h2d"}
    assert set(p.trace.meta["gpu_pool_reserved_bytes"]) == {"static", "gpu", "h2d"}
    assert simulate(plan, make_round_profile()).trace.label == plan.model.name


def _step_3b(order: str) -> float:
    plan = build_plan(PRESETS["llama-3.2-3b"], TrainSpec(micro_batch=8),
                      Policy.of(optimizer_order=order), num_steps=3)
    p = simulate(plan, load_profile("h200-bench"))
    assert p.feasible and p.bottleneck == "cpu"
    return p.step_s


def test_deadline_order_beats_arrival_on_cpu_bound_3b():
    # CPU-bound (AdamW + casts ~1.5 s/step on the CPU vs ~0.3 s of GPU work): running the
    # optimizer steps the next forward needs first lets that forward start under the CPU tail.
    arrival_s, deadline_s = _step_3b("arrival"), _step_3b("deadline")
    assert deadline_s < arrival_s


def _with_busy_speedup(profile, table):
    return dataclasses.replace(profile, gpu=dataclasses.replace(profile.gpu, busy_speedup=table))


def _gpu_tasks(plan):
    return [t for t in plan.tasks if t.lane == "gpu" and t.step == 0]


def test_a_gpu_that_idles_computes_at_its_busy_speedup():
    # 1B micro-batch 8 on h200-bench: the CPU sets the step, the GPU computes a fraction of it
    plan = build_plan(PRESETS["llama-3.2-1b"], TrainSpec(micro_batch=8), Policy.of(), num_steps=3)
    base = _with_busy_speedup(load_profile("h200-bench"), None)
    plain = simulate(plan, base)
    assert plain.gpu_speedup == 1.0
    assert gpu_compute_busy(_gpu_tasks(plan), CostModel(base), plain.step_s) < 0.8
    fast = simulate(plan, _with_busy_speedup(base, ((0.8, 1.25), (1.0, 1.0))))
    assert fast.gpu_speedup == 1.25  # below 80% busy: the table's top speed
    # every GPU task's compute 1.25x as fast; its HBM traffic and dispatch as they were
    bwd = plan.task("s0.m0.backward.L3")
    slow, quick = CostModel(base).cost(bwd), CostModel(base, gpu_speedup=1.25).cost(bwd)
    hbm_s = bwd.bytes / base.gpu.hbm_bytes_per_s
    assert quick.solo_s == pytest.approx((slow.solo_s - hbm_s) / 1.25 + hbm_s)
    assert quick.dispatch_s == slow.dispatch_s
    assert fast.step_s == pytest.approx(plain.step_s, rel=0.02)  # the CPU still sets it


def test_a_busy_gpu_settles_where_its_clock_and_busy_fraction_agree():
    # 3B micro-batch 32: the GPU sets the step; the speedup used is the table's answer to the
    # busy fraction it produced; without settling, a caller's cost model is taken as given
    plan = build_plan(PRESETS["llama-3.2-3b"], TrainSpec(micro_batch=32), Policy.of(), num_steps=3)
    base = _with_busy_speedup(load_profile("h200-bench"), None)
    profile = _with_busy_speedup(base, ((0.5, 1.3), (1.0, 1.0)))
    plain, settled = simulate(plan, base), simulate(plan, profile)
    assert 1.0 < settled.gpu_speedup < 1.3
    assert settled.step_s < plain.step_s
    costs = CostModel(profile, gpu_speedup=settled.gpu_speedup)
    busy = gpu_compute_busy(_gpu_tasks(plan), costs, settled.step_s)
    assert profile.gpu.speedup_at_busy(busy) == pytest.approx(settled.gpu_speedup, abs=0.01)
    given = simulate(plan, profile, costs=CostModel(profile), settle_clock=False)
    assert given.gpu_speedup == 1.0 and given.step_s == pytest.approx(plain.step_s)
    reused = simulate(plan, profile, costs=CostModel(profile))  # settles from the one given
    assert reused.gpu_speedup == pytest.approx(settled.gpu_speedup)


@pytest.mark.parametrize("policy", [Policy.of(), Policy.of(moments_on_nvme=1.0, window=1)])
def test_a_prediction_without_its_trace_is_the_same_prediction(policy):
    # the search's simulations keep no memory samples: the peaks come from the ledger itself
    plan = build_plan(PRESETS["llama-3.2-3b"], TrainSpec(micro_batch=4), policy)
    profile = load_profile("h200-bench")
    full = simulate(plan, profile, gpu_memory_bytes=24 * 2**30)
    lean = simulate(plan, profile, gpu_memory_bytes=24 * 2**30, keep_trace=False)
    assert lean.trace is None and full.trace is not None
    assert lean.peak_bytes == {t: full.trace.peak_bytes(t) for t in TIERS}
    assert dataclasses.replace(lean, trace=full.trace) == full
