"""Plan as data: JSON round trip, validation of lane orders against dependencies."""

import json

import pytest
from helpers import make_tiny_model

from layerslide.planner import Plan, Policy, TrainSpec, build_plan


@pytest.fixture
def plan(tiny_model):
    return build_plan(tiny_model, TrainSpec(micro_batch=2, seq_len=16, grad_accum=2,
                                            max_grad_norm=1.0),
                      Policy.of(activations="nvme", moments_on_nvme=0.5, cast="cpu_per_load"),
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
    other = build_plan(tiny_model, plan.train, Policy.of(), num_steps=2)
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
    with pytest.raises(ValueError, match="lower priority"):  # the order alone: inconsistent
        Plan.from_dict(data)
    tasks = {t["id"]: t for t in data["tasks"]}
    first, second = tasks[gpu[0]], tasks[gpu[1]]
    first["priority"], second["priority"] = second["priority"], first["priority"]
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


def test_only_a_tasks_scratch_can_outlive_its_outputs(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    handed_on = next(b for b in data["buffers"] if b["at_end"])  # made by one, read by another
    handed_on["outlives_outputs"] = True
    with pytest.raises(ValueError, match="must be that task's scratch"):
        Plan.from_dict(data)


def test_a_plan_file_from_before_outlives_outputs_still_loads(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    for b in data["buffers"]:
        del b["outlives_outputs"]
    assert not any(b.outlives_outputs for b in Plan.from_dict(data).buffers)


# what the placement records of the policy, as a plan file of format 2 before it had them
POLICY_PLACEMENT_FIELDS = ("load_source", "optimizer_writes_upload", "grad_sums",
                           "checkpoint_tier", "moment_precision")
RECORDED = [
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
     {"load_source": "upload", "optimizer_writes_upload": True, "grad_sums": "none",
      "checkpoint_tier": "host", "moment_precision": "fp32"}),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
     Policy.of(cast="gpu", activations="gpu", moment_precision="bf16"),
     {"load_source": "master", "optimizer_writes_upload": False, "grad_sums": "host",
      "checkpoint_tier": "gpu", "moment_precision": "bf16"}),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),
     Policy.of(cast="cpu_per_load", accumulation="layer_major", activations="nvme"),
     {"load_source": "staging", "optimizer_writes_upload": False, "grad_sums": "gpu",
      "checkpoint_tier": "nvme", "moment_precision": "fp32"}),
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(cpu_optimizer="torch"),
     {"load_source": "upload", "optimizer_writes_upload": False, "grad_sums": "none",
      "checkpoint_tier": "host", "moment_precision": "fp32"}),
]


@pytest.mark.parametrize(("train", "policy", "recorded"), RECORDED)
def test_the_placement_records_what_the_policy_decided_and_an_older_file_gets_the_same(
        tiny_model, train, policy, recorded):
    """The executor reads these from the placement: the builder writes them, and a plan file
    saved before they were fields is given them on load by the same rule."""
    built = build_plan(tiny_model, train, policy, num_steps=2)
    assert {k: getattr(built.placement, k) for k in POLICY_PLACEMENT_FIELDS} == recorded
    data = json.loads(json.dumps(built.to_dict()))
    for name in POLICY_PLACEMENT_FIELDS:
        del data["placement"][name]
    assert Plan.from_dict(data) == built


def test_a_placement_field_out_of_its_choices_is_refused(plan):
    data = json.loads(json.dumps(plan.to_dict()))
    data["placement"]["load_source"] = "disk"
    with pytest.raises(ValueError, match="load_source='disk': choose one of upload"):
        Plan.from_dict(data)


def test_every_slot_a_plan_names_is_in_a_space_its_placement_sizes(tiny_model):
    """The slot spaces are defined once (SLOT_SPACES): every task the builder gives a slot is of
    a kind in one, within the pool the placement holds for it (the GPU grad slots: the
    policy's)."""
    from layerslide.planner.plan import slot_space

    named = set()
    for train, policy in UNROLLED_POLICIES:
        plan = build_plan(tiny_model, train, policy)
        for t in plan.tasks:
            if t.slot < 0:
                continue
            space = slot_space(t.kind)
            assert space is not None, t.id
            count = space.placed(plan.placement)
            assert 0 <= t.slot < (policy.residency.grad_buffers if count is None else count)
            named.add(space.what)
    assert named == {"landing", "staging", "GPU grad", "weight staging"}


def _canonical(plan: Plan) -> dict:
    """The plan as data, its tasks, edges and buffers in a fixed order (ids are unique)."""
    data = plan.to_dict()
    data["tasks"] = sorted(data["tasks"], key=lambda t: t["id"])
    data["edges"] = sorted(map(tuple, data["edges"]))
    data["buffers"] = sorted(data["buffers"], key=lambda b: b["id"])
    return data


UNROLLED_POLICIES = [
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of()),
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(window=2, cpu_optimizer="torch",
                                                  cast_worker=True)),
    (TrainSpec(micro_batch=2, seq_len=16, grad_accum=3), Policy.of(window=1, activations="gpu")),
    (TrainSpec(micro_batch=1, seq_len=16, max_grad_norm=1.0),
     Policy.of(moments_on_nvme=1.0, master_on_nvme=0.5, nvme_prefetch=3, activations="nvme")),
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(cast="cpu_per_load", host_grad_buffers=3,
                                                  grad_buffers=3)),
    (TrainSpec(micro_batch=1, seq_len=16), Policy.of(cast="gpu", gpu_updated_blocks=2,
                                                  resident_layers=1)),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=3),
     Policy.of(accumulation="layer_major", host_grad_buffers=2, activations="nvme")),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=2, max_grad_norm=1.0),
     Policy.of(accumulation="layer_major", cast="cpu_per_load", gpu_updated_blocks=1)),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=2),  # weight staging slots taken in turn
     Policy.of(weights_on_nvme=0.5, moments_on_nvme=0.5, gpu_updated_blocks=1)),
    (TrainSpec(micro_batch=1, seq_len=16, grad_accum=3),
     Policy.of(accumulation="layer_major", weights_on_nvme=1.0, prefetch_depth=2, window=2)),
]


@pytest.mark.parametrize("num_layers", [2, 3, 5])
@pytest.mark.parametrize(("train", "policy"), UNROLLED_POLICIES)
def test_a_plan_unrolled_is_the_plan_built_for_that_many_steps(num_layers, train, policy):
    """A segment of N steps is the planned steps, then the last one repeated: the same tasks,
    edges, units, slots, buffers and lane orders as planning N steps (5 layers through a ring
    of 2 units take them in another order every step)."""
    from layerslide.planner.build import build_repeatable_plan

    model = make_tiny_model(num_layers=num_layers)
    planned = build_repeatable_plan(model, train, policy)  # 3 steps, or more where needed
    for steps in (1, 2, 3, 4, 7):
        expected = build_plan(model, train, policy, num_steps=max(steps, 2))
        if steps == 1:
            assert planned.unroll(1).num_steps == 1
            assert all(t.step == 0 for t in planned.unroll(1).tasks)
            continue
        assert _canonical(planned.unroll(steps)) == _canonical(expected), steps


def test_a_plan_file_unrolls_as_the_plan_does(plan, tmp_path):
    plan = build_plan(plan.model, plan.train, plan.policy, num_steps=3)
    plan.save(tmp_path / "plan.json")
    assert _canonical(Plan.load(tmp_path / "plan.json").unroll(5)) == _canonical(plan.unroll(5))


def test_a_plan_whose_ids_were_renamed_is_not_repeated(plan):
    data = plan.to_dict()
    last = next(t for t in data["tasks"] if t["step"] == plan.num_steps - 1)
    old = last["id"]
    last["id"] = "renamed"
    data["edges"] = [[("renamed" if u == old else u), ("renamed" if v == old else v), r]
                     for u, v, r in data["edges"]]
    data["lane_order"] = {lane: ["renamed" if t == old else t for t in order]
                          for lane, order in data["lane_order"].items()}
    data["buffers"] = [{**b, "alloc_task": "renamed" if b["alloc_task"] == old else
                        b["alloc_task"], "release_tasks": ["renamed" if t == old else t
                                                           for t in b["release_tasks"]]}
                       for b in data["buffers"]]
    data["meta"]["step_markers"] = ["renamed" if t == old else t
                                    for t in data["meta"]["step_markers"]]
    edited = Plan.from_dict(data)
    with pytest.raises(ValueError, match="task_id"):
        edited.unroll(plan.num_steps + 1)
    assert edited.unroll(1).num_steps == 1  # its first steps need no repeating


def test_unroll_needs_a_step(plan):
    with pytest.raises(ValueError, match="at least one step"):
        plan.unroll(0)


def test_a_plan_too_short_to_hold_its_dependencies_is_not_repeated_and_more_steps_are_planned():
    """Staging slots reused more than a step back (nvme_prefetch above a step's reads): a last
    step with an index below that reach lacks edges to repeat, so unroll refuses;
    build_repeatable_plan plans enough steps, and its unroll is the plan built for that many."""
    from layerslide.planner.build import build_repeatable_plan

    model, train = make_tiny_model(num_layers=3), TrainSpec(micro_batch=1, seq_len=16)
    policy = Policy.of(moments_on_nvme=1.0, master_on_nvme=0.5, nvme_prefetch=11)
    short = build_plan(model, train, policy)
    assert short.reach_steps() == 3  # 11 staging slots, 5 blocks' reads a step
    with pytest.raises(ValueError, match="plan at least 4"):
        short.unroll(6)
    repeatable = build_repeatable_plan(model, train, policy)
    assert repeatable.num_steps == 4
    assert _canonical(repeatable.unroll(9)) == _canonical(build_plan(model, train, policy,
                                                                     num_steps=9))
    assert build_repeatable_plan(model, train, Policy.of()).num_steps == 3


def test_a_grad_slot_pool_larger_than_a_steps_backwards_reaches_that_many_steps_back():
    """One sliding layer, five GPU grad slots: a backward waits for the offload five steps back,
    which no edge of a 3-step plan's last step shows; the planner says so (reach_steps)."""
    from layerslide.planner.build import build_repeatable_plan

    model, train = make_tiny_model(num_layers=1), TrainSpec(micro_batch=1, seq_len=16)
    policy = Policy.of(grad_buffers=5)
    assert build_plan(model, train, policy).reach_steps() == 5
    repeatable = build_repeatable_plan(model, train, policy)
    assert repeatable.num_steps == 6
    assert _canonical(repeatable.unroll(8)) == _canonical(build_plan(model, train, policy,
                                                                     num_steps=8))
