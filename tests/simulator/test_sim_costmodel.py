"""The cost model's rules: one per task kind, every kind of every plan costed."""

import dataclasses

import pytest
from helpers import make_round_profile

from layerslide.kinds import Lane, TaskKind
from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.simulator import CostModel
from layerslide.simulator.costmodel import HOST_CORES, PCIE, RULES


def test_every_task_kind_has_a_cost_rule():
    assert set(RULES) == set(TaskKind)


def test_a_kind_without_a_rule_is_refused_by_name(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16), Policy.of(), num_steps=3)
    task = dataclasses.replace(plan.tasks[0], kind="teleport")
    with pytest.raises(ValueError, match="no cost model for kind 'teleport'"):
        CostModel(make_round_profile()).cost(task)


def test_an_optimizer_step_is_gpu_work_on_the_gpu_and_a_cpu_kernel_on_the_cpu(tiny_model):
    plan = build_plan(tiny_model, TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(gpu_updated_blocks=1), num_steps=3)
    costs = CostModel(make_round_profile())
    steps = {t.lane: costs.cost(t) for t in plan.tasks if t.kind == TaskKind.OPTIMIZER_STEP}
    assert set(steps) == {Lane.GPU, Lane.CPU}
    assert steps[Lane.GPU].uses == () and steps[Lane.GPU].solo_s > 0
    assert dict(steps[Lane.CPU].uses)[HOST_CORES] == make_round_profile().host.cores
    loads = [costs.cost(t) for t in plan.tasks if t.kind == TaskKind.LOAD_WEIGHTS]
    assert loads and all(PCIE in dict(c.uses) for c in loads)
