"""What a search reuses of the simulator: costs per task shape, floors by block, simulations of
a plan met again."""

import pytest

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel, simulate
from layerslide.simulator.costmodel import shape_of
from layerslide.simulator.predict import (
    SimulationMemo,
    floors_by_block,
    plan_outline,
    plan_signature,
    step_floors,
)


def test_a_cost_is_worked_out_once_per_task_shape(tiny_model, round_profile):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16), Policy.of(), num_steps=3)
    costs = CostModel(round_profile)
    for task in plan.tasks:
        assert costs.cost(task) is costs.cost(task)
    shapes = {shape_of(t) for t in plan.tasks}
    assert len(costs._costs) == len(shapes) < len(plan.tasks)  # layers and steps repeat
    fresh = CostModel(round_profile)
    assert all(costs.cost(t) == fresh.cost(t) for t in plan.tasks)


def test_floors_by_block_add_up_to_the_step_floors(tiny_model, round_profile):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16),
                      Policy.of(activations="host"), num_steps=3)
    costs = CostModel(round_profile)
    by_block = floors_by_block(plan, costs)
    assert set(by_block) == {-1, 0, 1, 2}
    total = {}
    for floors in by_block.values():
        for key, value in floors.items():
            total[key] = total.get(key, 0.0) + value
    assert total == pytest.approx(step_floors(plan, costs), rel=1e-12)
    compute = floors_by_block(plan, costs, kinds=("forward", "backward", "head"))
    assert set(compute[0]) <= {"lane:gpu", "dispatch:gpu"}
    assert compute[0]["lane:gpu"] < by_block[0]["lane:gpu"] + 1e-12


def test_a_plan_met_again_is_simulated_once():
    model, profile = PRESETS["llama-3.2-1b"], load_profile("h200-bench")
    train = TrainSpec(micro_batch=4)
    # a window wider than the layers it slides over makes the same plan as the widest that fits
    wide = build_plan(model, train, Policy.of(window=64))
    widest = build_plan(model, train, Policy.of(window=model.num_layers))
    other = build_plan(model, train, Policy.of(window=2))
    assert plan_signature(wide) == plan_signature(widest) != plan_signature(other)
    memo = SimulationMemo()
    first = simulate(wide, profile, memo=memo)
    runs = len(memo._runs)  # one per speed its clock was simulated at
    again = simulate(widest, profile, memo=memo)
    assert len(memo._runs) == runs  # the other plan's runs came back
    plain = simulate(widest, profile)
    assert first.step_s == again.step_s == plain.step_s
    assert first.peak_bytes == again.peak_bytes == plain.peak_bytes


def test_the_memo_signs_a_plan_only_where_an_outline_matches():
    model, profile = PRESETS["llama-3.2-1b"], load_profile("h200-bench")
    train = TrainSpec(micro_batch=4)
    wide = build_plan(model, train, Policy.of(window=64))
    widest = build_plan(model, train, Policy.of(window=model.num_layers))
    other = build_plan(model, train, Policy.of(window=2))
    assert plan_outline(wide) == plan_outline(widest) != plan_outline(other)
    memo = SimulationMemo()
    simulate(wide, profile, memo=memo, settle_clock=False)
    simulate(other, profile, memo=memo, settle_clock=False)
    assert [e.signature for e in memo._runs] == [None, None]  # outlines differ: none signed
    simulate(widest, profile, memo=memo, settle_clock=False)  # the same plan, built again
    assert len(memo._runs) == 2
    assert memo._runs[-1].signature == plan_signature(wide)


def test_the_memo_keeps_runs_while_their_plans_hold_at_most_max_tasks():
    model, profile = PRESETS["llama-3.2-1b"], load_profile("h200-bench")
    train = TrainSpec(micro_batch=4)
    plans = [build_plan(model, train, Policy.of(window=w)) for w in (1, 2, 4)]
    tasks = [len(p.graph) for p in plans]
    memo = SimulationMemo(size=8, max_tasks=tasks[0] + tasks[1])
    for plan in plans:
        simulate(plan, profile, memo=memo, settle_clock=False)
    assert [e.plan for e in memo._runs] == plans[1:]  # the first went to make room
    assert memo._tasks == tasks[1] + tasks[2]
    simulate(plans[0], profile, memo=memo, settle_clock=False)  # simulated again, kept again
    assert [e.plan for e in memo._runs] == [plans[2], plans[0]]
