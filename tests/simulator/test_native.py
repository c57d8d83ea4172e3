"""The C engine (simulator.native) runs every plan as the Python engine does: the same step
markers, lane spans (and lanes' order), peaks, pool peaks and reserves, bit for bit; where it
cannot, the Python engine runs (and raises what it raises)."""

from dataclasses import replace

import pytest
from helpers import make_round_host, make_round_profile, make_tiny_model, random_plan_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.planner.plan import Buffer
from layerslide.simulator import CostModel, native, sharing
from layerslide.simulator.engine import simulate_run
from layerslide.simulator.memory import STATIC_POOL
from layerslide.tuner import SearchSpace, tune

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler here")

# the round profile, one whose NVMe has a mixed capacity (reads and writes at once), and a
# host of several GPUs with NVLink and a network (the collectives' resources)
PROFILES = [make_round_profile(), load_profile("h200-bench"), make_round_host(gpus=4)]


def assert_same_run(plan, costs) -> None:
    assert native.simulate(plan, costs) is not None  # the C engine runs it, not Python again
    python = simulate_run(plan, costs, keep_memory=False, keep_events=False, native=False)
    c = simulate_run(plan, costs, keep_memory=False, keep_events=False)
    assert c.marker_ends_s == python.marker_ends_s
    assert list(c.spans.items()) == list(python.spans.items())  # the lanes' order too
    assert c.trace.memory == python.trace.memory
    for key, value in python.trace.meta.items():
        assert c.trace.meta[key] == value, key
        if isinstance(value, dict):
            assert list(c.trace.meta[key]) == list(value), f"{key}: the pools' order"
    assert c.trace.meta.keys() == python.trace.meta.keys()


@st.composite
def cases(draw):
    model, train, policy = draw(random_plan_inputs(every_schedule=True))
    profile = draw(st.sampled_from(PROFILES))
    costs = CostModel(profile, gpu_speedup=draw(st.sampled_from([1.0, 1.37])),
                      lanes_first=draw(st.booleans()))
    return model, train, policy, costs, draw(st.integers(3, 4))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_plans_run_alike_in_c_and_in_python(case):
    model, train, policy, costs, steps = case
    assert_same_run(build_plan(model, train, policy, num_steps=steps), costs)


@pytest.mark.parametrize(("model", "profile", "train", "policy"), [
    ("qwen3-8b", "h200-bench", TrainSpec(micro_batch=32, grad_accum=4),
     Policy.of(window=2, accumulation="layer_major", activations="host", cast="cpu_once",
               moments_on_nvme=0.5, gpu_updated_blocks=24, sweep_groups=8, stream_run_ahead=3)),
    ("llama-3.2-3b", "rtx4090-256gb", TrainSpec(micro_batch=8, grad_accum=2),
     Policy.of(window=3, activations="nvme", cast="cpu_per_load", moments_on_nvme=1.0,
               host_grad_buffers=2, cpu_optimizer="torch", cast_worker=True)),
])
def test_real_plans_run_alike_in_c_and_in_python(model, profile, train, policy):
    plan = build_plan(PRESETS[model], train, policy, validate=False)
    assert_same_run(plan, CostModel(load_profile(profile)))


def test_a_tune_over_several_ranks_picks_alike_with_either_engine(monkeypatch):
    space = SearchSpace(windows=(1, 2), micro_batches=(1, 4), grad_accums=(1, 2),
                        activations=("gpu", "host"), cast_workers=(False,), casts=("cpu_once",))
    model, host = make_tiny_model(num_layers=4), make_round_host(gpus=4)
    fast = tune(model, host, seq_len=64, space=space, workers=1, gpus=2, hosts=2)
    monkeypatch.setattr(native, "_library", lambda: None)
    slow = tune(model, host, seq_len=64, space=space, workers=1, gpus=2, hosts=2)
    assert [c.row() for c in fast.candidates] == [c.row() for c in slow.candidates]


def _tiny_plan(**policy):
    return build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16),
                      Policy.of(**policy), num_steps=3)


@pytest.mark.parametrize("run_ahead", [2**32 + 1, 10**12])
def test_a_run_ahead_past_int32_runs_alike(run_ahead):
    assert_same_run(_tiny_plan(stream_run_ahead=run_ahead), CostModel(make_round_profile()))


def test_sharing_adds_left_to_right_as_the_c_engine_on_every_python():
    # sum() of floats compensates its round-off from Python 3.12 on; this would give 1.0
    assert sharing._added([1e16, 1.0, -1e16]) == 0.0


def _with_buffer(plan, buffer):
    return replace(plan, buffers=(*plan.buffers, buffer))


def test_plans_python_raises_on_are_left_to_python():
    plan, costs = _tiny_plan(activations="host"), CostModel(make_round_profile())
    released = next(b for b in plan.buffers if b.release_tasks)
    # a release by no task: the ledger's KeyError
    no_task = replace(plan, buffers=tuple(
        replace(b, release_tasks=(*b.release_tasks, None)) if b is released else b
        for b in plan.buffers))
    # a GPU block gone before it came, in a pool nothing came to yet
    first_d2h = plan.lane_order["d2h"][0]
    early = _with_buffer(plan, Buffer(id="early", tier="gpu", bytes=4096, alloc_task=first_d2h,
                                      release_tasks=("s0.m0.forward.emb",)))
    for odd in (no_task, early):
        assert native.simulate(odd, costs) is None
        with pytest.raises(KeyError):
            simulate_run(odd, costs, keep_memory=False, keep_events=False)


def test_plans_read_otherwise_in_python_are_left_to_it():
    plan, costs = _tiny_plan(), CostModel(make_round_profile())
    worker = next(lane for lane, d in plan.lane_discipline.items()
                  if d == "priority" and plan.lane_order[lane])
    # a lane named as the allocator's static pool; a task listed in another lane than its own
    static = replace(plan, lane_order={(STATIC_POOL if lane == worker else lane): order
                                       for lane, order in plan.lane_order.items()},
                     lane_discipline={(STATIC_POOL if lane == worker else lane): d
                                      for lane, d in plan.lane_discipline.items()})
    other = next(lane for lane in plan.lane_order if lane != worker)
    moved = replace(plan, lane_order={**plan.lane_order, other: (*plan.lane_order[other],
                                                                 *plan.lane_order[worker]),
                                      worker: ()})
    assert native.simulate(static, costs) is None
    assert native.simulate(moved, costs) is None


def test_a_deadlocked_plan_is_left_to_python_which_says_so():
    plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                      num_steps=2)
    lane = "gpu"
    order = plan.lane_order[lane]
    stuck = replace(plan, lane_order={**plan.lane_order, lane: order[::-1]})
    costs = CostModel(make_round_profile())
    with pytest.raises(RuntimeError, match="stalled"):
        simulate_run(stuck, costs, keep_memory=False, keep_events=False)


def test_a_plan_it_does_not_model_runs_in_python():
    plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                      num_steps=3)
    costs = CostModel(make_round_profile())
    halves = replace(plan, buffers=tuple(replace(b, bytes=b.bytes + 0.5) for b in plan.buffers))
    assert native.simulate(halves, costs) is None
    assert simulate_run(halves, costs, keep_memory=False, keep_events=False).marker_ends_s


def test_without_the_library_runs_are_pythons(monkeypatch):
    monkeypatch.setenv("LAYERSLIDE_NATIVE", "0")
    native._library.cache_clear()
    try:
        assert not native.available()
        plan = build_plan(make_tiny_model(), TrainSpec(micro_batch=1, seq_len=16), Policy.of(),
                          num_steps=3)
        assert simulate_run(plan, CostModel(make_round_profile()), keep_memory=False,
                            keep_events=False).spans
    finally:
        native._library.cache_clear()
