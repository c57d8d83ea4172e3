"""Plan as data: JSON round trip, validation of lane orders against dependencies."""

import json

import pytest

from layerslide.planner import Plan, Policy, TrainSpec, build_plan


@pytest.fixture
def plan(tiny_model):
    return build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16, grad_accum=2,
                                            max_grad_norm=1.0),
                      Policy(activations="nvme", moments_on_nvme=0.5, cast="cpu_per_load"),
                      num_steps=2)


def test_json_round_trip_is_equal(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.tasks == plan.tasks
    assert loaded.lane_order == plan.lane_order
    assert loaded.buffers == plan.buffers
    assert sorted(loaded.graph.edges(data=True)) == sorted(plan.graph.edges(data=True))


def test_a_changed_plan_is_not_equal(plan, tiny_model):
    other = build_plan(tiny_model, plan.train, Policy(), num_steps=2)
    assert other != plan


def test_other_format_version_is_refused(plan):
    data = plan.to_dict()
    data["format_version"] = 99
    with pytest.raises(ValueError, match="rebuild the plan"):
        Plan.from_dict(data)


def test_unreadable_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        Plan.load(bad)


def test_lane_order_that_contradicts_dependencies_is_refused(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    gpu = data["lane_order"]["gpu"]
    gpu[0], gpu[1] = gpu[1], gpu[0]  # layer 0's forward before the embedding's
    with pytest.raises(ValueError, match="deadlocks"):
        Plan.from_dict(data)


def test_task_missing_from_lane_orders_is_refused(plan):
    data = plan.to_dict()
    data["lane_order"]["cpu"] = data["lane_order"]["cpu"][1:]
    with pytest.raises(ValueError, match="not in the order of its lane"):
        Plan.from_dict(data)


def test_every_buffer_is_released_by_tasks_that_exist(plan):
    for b in plan.buffers:
        for t in (b.alloc_task, *b.release_tasks):
            assert t is None or t in plan.graph


def test_a_buffer_id_used_twice_is_refused(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    data["buffers"].append(dict(data["buffers"][-1]))
    with pytest.raises(ValueError, match="buffer ids must be unique"):
        Plan.from_dict(data)


def test_a_buffer_made_as_its_task_ends_needs_another_task_to_release_it(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    made = next(b for b in data["buffers"] if b["at_end"])
    made["release_tasks"] = [made["alloc_task"]]
    with pytest.raises(ValueError, match="another task to release it"):
        Plan.from_dict(data)
