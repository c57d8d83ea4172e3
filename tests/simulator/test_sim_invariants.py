"""Properties every simulated trace must have, over a spread of plans and two profiles:
bounds on the makespan, dependencies and lane orders honoured, lanes never double-booked,
memory never negative and back to the static buffers at the end."""

from __future__ import annotations

import itertools
from functools import cache

import networkx as nx
import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import load_profile
from layerslide.planner import Plan, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, simulate
from layerslide.trace import TIERS

REL_TOL = 1e-9

# name -> (TrainSpec overrides, Policy overrides)
CASES = {
    "default": ({}, {}),
    "window1": ({}, {"window": 1}),
    "act_gpu": ({}, {"activations": "gpu"}),
    "act_host": ({}, {"activations": "host"}),
    "act_nvme": ({}, {"activations": "nvme"}),
    "cast_cpu_once": ({}, {"cast": "cpu_once"}),
    "cast_cpu_per_load": ({}, {"cast": "cpu_per_load"}),
    "cast_gpu": ({}, {"cast": "gpu"}),
    "moments_nvme_half": ({}, {"moments_on_nvme": 0.5}),
    "grad_accum2": ({"grad_accum": 2}, {}),
    "clip": ({"max_grad_norm": 1.0}, {}),
    "order_arrival": ({}, {"optimizer_order": "arrival"}),
    "order_deadline": ({}, {"optimizer_order": "deadline"}),
    "host_grad_buffers2": ({}, {"host_grad_buffers": 2}),
}
LAYERS = (2, 6)
PROFILES = ("round", "h200-bench")  # h200-bench: host memory, PCIe and disk contention active


@cache
def _profile(name: str):
    return make_round_profile() if name == "round" else load_profile(name)


@cache
def _run(case: str, layers: int, profile_name: str):
    train_kw, policy_kw = CASES[case]
    plan = build_plan(make_tiny_model(layers), TrainSpec(micro_batch=2, seq_len=32, **train_kw),
                      Policy.of(**policy_kw), num_steps=3)
    profile = _profile(profile_name)
    prediction = simulate(plan, profile)
    assert prediction.trace is not None, prediction.reason
    costs = CostModel(profile)
    solo = {t.id: costs.cost(t).solo_s for t in plan.tasks}
    dispatch = {t.id: costs.cost(t).dispatch_s for t in plan.tasks}
    return plan, prediction, solo, dispatch


ALL = [pytest.param(c, n, p, id=f"{c}-{n}L-{p}") for c in CASES for n in LAYERS for p in PROFILES]


def _critical_path_s(plan, solo: dict[str, float]) -> float:
    """Longest path through the dependency graph (no lane order), weighting tasks by solo time."""
    finish: dict[str, float] = {}
    for tid in nx.topological_sort(plan.graph):
        ready_s = max((finish[u] for u in plan.graph.predecessors(tid)), default=0.0)
        finish[tid] = ready_s + solo[tid]
    return max(finish.values())


@pytest.mark.parametrize(("case", "layers", "profile_name"), ALL)
def test_makespan_between_critical_path_and_serial_sum(case, layers, profile_name):
    plan, prediction, solo, dispatch = _run(case, layers, profile_name)
    makespan_s = prediction.trace.makespan_s
    critical_s = _critical_path_s(plan, solo)
    # a task lasts at most its work or its whole dispatch, whichever is longer
    serial_s = sum(max(solo[t], dispatch[t]) for t in solo)
    assert critical_s > 0
    assert critical_s <= makespan_s * (1 + REL_TOL)
    assert makespan_s <= serial_s * (1 + REL_TOL)
    assert len(prediction.trace.events) == plan.graph.number_of_nodes()


@pytest.mark.parametrize(("case", "layers", "profile_name"), ALL)
def test_dependencies_and_lane_orders_honoured(case, layers, profile_name):
    plan, prediction, solo, _ = _run(case, layers, profile_name)
    ev = {e.task_id: e for e in prediction.trace.events}
    for u, v in plan.graph.edges:
        assert ev[v].start_s >= ev[u].end_s, (u, v)
    for tid, e in ev.items():
        # contention only slows a task down; a tiny slack for the engine's float round-off
        assert e.duration_s >= solo[tid] * (1 - REL_TOL) - 1e-12, tid
        assert e.lane == plan.task(tid).lane
    for lane, order in plan.lane_order.items():
        if plan.lane_discipline[lane] != "strict":
            continue
        for a, b in itertools.pairwise(order):
            assert ev[b].start_s >= ev[a].end_s, (lane, a, b)
    for lane in plan.lane_order:
        runs = sorted((e.start_s, e.end_s, e.task_id) for e in ev.values() if e.lane == lane)
        for (_, end_a, a), (start_b, _, b) in itertools.pairwise(runs):
            assert start_b >= end_a, (lane, a, b)


@pytest.mark.parametrize(("case", "layers", "profile_name"), ALL)
def test_memory_never_negative_and_returns_to_static(case, layers, profile_name):
    plan, prediction, *_ = _run(case, layers, profile_name)
    samples = prediction.trace.memory
    assert all(m.bytes_in_use >= 0 for m in samples)
    for tier in TIERS:
        tier_samples = [m for m in samples if m.tier == tier]
        static = plan.static_bytes(tier)
        assert tier_samples[0].bytes_in_use == static  # before the first task starts
        # and what a task made to keep (the compute stream's BLAS workspaces)
        assert tier_samples[-1].bytes_in_use == static + plan.kept_bytes(tier), tier
        assert prediction.peak_bytes[tier] >= static
        times = [m.time_s for m in tier_samples]
        assert times == sorted(times)
    # every GPU plan holds more than its static buffers at some point (workspaces)
    assert prediction.peak_bytes["gpu"] > plan.static_bytes("gpu")


def test_cases_really_differ():
    """Guard against the policy overrides being ignored: the traces differ in step time."""
    # on the round profile: on h200-bench the tiny model's step is its kernel dispatches alone
    steps = {case: _run(case, 6, "round")[1].step_s for case in CASES}
    assert len(set(steps.values())) >= 5, steps
    # NVMe activations and state put tasks on the disk lanes; the default plan has none
    for case, has_nvme in (("default", False), ("act_nvme", True), ("moments_nvme_half", True)):
        lanes = set(_run(case, 2, "round")[1].trace.lanes)
        assert ("nvme_read" in lanes and "nvme_write" in lanes) == has_nvme, case


@pytest.mark.parametrize("profile_name", PROFILES)
def test_simulation_is_deterministic_and_survives_a_plan_round_trip(profile_name):
    plan, prediction, *_ = _run("act_nvme", 6, profile_name)
    again = simulate(plan, _profile(profile_name))
    assert again.trace.events == prediction.trace.events
    assert again.trace.memory == prediction.trace.memory
    reloaded = simulate(Plan.from_dict(plan.to_dict()), _profile(profile_name))
    assert reloaded.trace.events == prediction.trace.events
    assert reloaded.peak_bytes == prediction.peak_bytes
