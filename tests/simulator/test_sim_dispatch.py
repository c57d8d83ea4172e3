"""Stream lanes as the executor runs them: a host thread dispatches each task, possibly while its
inputs are still in flight, at most Policy.stream_run_ahead ahead of the GPU."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import make_round_profile, make_tiny_model

from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.planner.settings import LANES_FIRST_NICE
from layerslide.simulator import CostModel, simulate
from layerslide.simulator.sharing import water_fill

TRAIN = TrainSpec(micro_batch=2, seq_len=16)


def _profile(*, launch_s: float, flops: float = 1e12, h2d: float = 1e9):
    base = make_round_profile(adamw_params_per_s=1e12, cast_bytes_per_s=1e15)
    gpu = dataclasses.replace(base.gpu, kernel_launch_s=launch_s, bf16_flops_per_s=flops)
    link = dataclasses.replace(base.link, h2d_bytes_per_s=h2d, duplex_bytes_per_s=2 * h2d)
    return dataclasses.replace(base, gpu=gpu, link=link)


def test_a_tasks_dispatch_hides_behind_the_wait_for_its_weights():
    # window 1 and a slow link: each layer waits for its weights; the thread dispatches the
    # layer's kernels meanwhile, so the task lasts less than its dispatch once they land
    profile = _profile(launch_s=2e-6, h2d=2e7)
    plan = build_plan(make_tiny_model(num_layers=4), TRAIN, Policy.of(window=1, prefetch_depth=1),
                      num_steps=3)
    costs = CostModel(profile)
    events = [e for e in simulate(plan, profile).trace.events if e.kind == "forward"
              and e.block >= 0]
    costs_of = {e.task_id: costs.cost(plan.task(e.task_id)) for e in events}
    assert all(e.duration_s >= costs_of[e.task_id].solo_s * (1 - 1e-9) for e in events)
    hidden = [e for e in events if e.duration_s < 0.5 * costs_of[e.task_id].dispatch_s]
    assert len(hidden) >= len(events) // 2, "dispatch should overlap most loads"


def test_with_one_task_in_flight_short_tasks_cannot_be_dispatched_ahead():
    # A task's own kernels run as they are dispatched, so a bound of 1 costs the GPU nothing
    # where each task's work outlasts its dispatch; it costs where a short, dispatch-bound task
    # follows a long one, whose run it could have been dispatched during (1B micro-batch 1,
    # window 1, on the H200 profile without its clock table, a dispatch sharing the cores
    # equally with AdamW)
    base = load_profile("h200-bench")
    profile = dataclasses.replace(
        base, gpu=dataclasses.replace(base.gpu, busy_speedup=None),
        host=dataclasses.replace(base.host, kernel_launch_beside_kernels_s=None,
                                 kernel_launch_beside_niced_kernels_s=None))

    def step_s(run_ahead):
        plan = build_plan(PRESETS["llama-3.2-1b"], TrainSpec(micro_batch=1),
                          Policy.of(window=1, stream_run_ahead=run_ahead), num_steps=3)
        return simulate(plan, profile).step_s

    one, three, unbounded = step_s(1), step_s(3), step_s(0)
    assert one > three * 1.005
    assert three == pytest.approx(unbounded, rel=1e-3)


def test_dispatch_shares_the_cores_with_the_cpu_kernels_and_the_task_waits_for_it():
    # a dispatch-bound GPU lane beside a busy CPU lane: the more cores a launching thread needs,
    # the more AdamW's threads on every core slow its dispatch (and it theirs)
    base = _profile(launch_s=5e-5)
    slow_cpu = dataclasses.replace(base.host, adamw_params_per_s=2e6)

    def run(dispatch_cores: float):
        host = dataclasses.replace(slow_cpu, dispatch_cores=dispatch_cores)
        profile = dataclasses.replace(base, host=host)
        plan = build_plan(make_tiny_model(num_layers=4), TRAIN, Policy.of(window=2), num_steps=3)
        prediction = simulate(plan, profile)
        costs = CostModel(profile)
        events = [e for e in prediction.trace.events if e.lane == "gpu"]
        # no GPU task ends before its GPU work alone could have
        assert all(e.duration_s >= costs.cost(plan.task(e.task_id)).solo_s * (1 - 1e-9)
                   for e in events)
        return prediction.trace, prediction.step_s

    light_trace, light = run(1e-3)
    heavy_trace, heavy = run(float(base.host.cores))
    assert heavy > light * 1.01

    def gpu_s(trace):
        return sum(e.duration_s for e in trace.events if e.lane == "gpu")
    assert gpu_s(heavy_trace) > gpu_s(light_trace)


@pytest.mark.parametrize(("beside_s", "rate"), [(2e-5, 0.5), (1.25e-5, 0.8), (1e-5, 1.0),
                                               (5e-6, 1.0)])
def test_a_dispatch_beside_the_cpu_kernels_runs_at_the_measured_share_of_its_speed(beside_s,
                                                                                    rate):
    # a launch measured at 10 us alone and beside_s beside the kernels on every core: against
    # one such kernel a dispatch runs at 10 us / beside_s of its speed (never faster than alone)
    base = _profile(launch_s=1e-5)
    profile = dataclasses.replace(base, host=dataclasses.replace(
        base.host, kernel_launch_beside_kernels_s=beside_s))
    cores, taken = float(profile.host.cores), profile.host.dispatch_cores
    share = CostModel(profile).dispatch_share
    kernel, dispatch = water_fill([cores, taken], [1.0, share], cores)
    assert dispatch == pytest.approx(rate)
    assert kernel < 1.0  # the dispatch's core comes from the kernel


def test_without_a_measured_price_beside_the_kernels_a_dispatch_shares_the_cores_equally():
    profile = _profile(launch_s=1e-5)
    assert profile.host.kernel_launch_beside_kernels_s is None
    assert CostModel(profile).dispatch_share == 1.0


def test_a_dispatch_slowed_beside_the_cpu_kernels_slows_a_dispatch_bound_step():
    base = _profile(launch_s=5e-5)
    slow_cpu = dataclasses.replace(base.host, adamw_params_per_s=2e6)
    plan = build_plan(make_tiny_model(num_layers=4), TRAIN, Policy.of(window=2), num_steps=3)

    def step_s(beside_s):
        host = dataclasses.replace(slow_cpu, kernel_launch_beside_kernels_s=beside_s)
        return simulate(plan, dataclasses.replace(base, host=host)).step_s

    assert step_s(2e-4) > step_s(5e-5) * 1.01


def test_a_lanes_first_plan_is_priced_at_the_launch_beside_niced_kernels():
    base = _profile(launch_s=5e-5)
    host = dataclasses.replace(base.host, adamw_params_per_s=2e6,
                               kernel_launch_beside_kernels_s=2e-4)
    plain_only = dataclasses.replace(base, host=host)
    both = dataclasses.replace(base, host=dataclasses.replace(
        host, kernel_launch_beside_niced_kernels_s=6e-5))
    # the plain price where no niced one is measured, and for a plan that does not nice
    assert CostModel(plain_only, lanes_first=True).dispatch_share == \
        CostModel(plain_only).dispatch_share == CostModel(both).dispatch_share
    assert CostModel(both, lanes_first=True).dispatch_share > CostModel(both).dispatch_share

    model = make_tiny_model(num_layers=4)
    plain = build_plan(model, TRAIN, Policy.of(window=2), num_steps=3)
    niced = build_plan(model, TRAIN, Policy.of(window=2, cpu_nice=LANES_FIRST_NICE), num_steps=3)
    assert niced.policy.executor.lanes_first and not plain.policy.executor.lanes_first
    # simulate prices each plan by its own knobs, even from a cost model made for the other
    assert simulate(niced, both).step_s < simulate(plain, both).step_s / 1.01
    assert simulate(niced, both, costs=CostModel(both)).step_s == simulate(niced, both).step_s
    assert simulate(niced, plain_only).step_s == simulate(plain, plain_only).step_s


def test_the_trace_keeps_each_stream_tasks_enqueue_and_none_for_host_lanes():
    # the enqueue begins no later than the task on the GPU (it may run ahead) and the task ends
    # no sooner than it; the first test's setup, where the dispatch hides behind weight loads
    profile = _profile(launch_s=2e-6, h2d=2e7)
    plan = build_plan(make_tiny_model(num_layers=4), TRAIN, Policy.of(window=1, prefetch_depth=1),
                      num_steps=3)
    costs = CostModel(profile)
    events = simulate(plan, profile).trace.events
    strict = {e for e in events if plan.lane_discipline[e.lane] == "strict"}
    assert strict and all(e.dispatch_start_s is None and e.dispatch_end_s is None
                          for e in set(events) - strict)
    for e in strict:
        assert e.dispatch_start_s <= e.start_s + 1e-12 and e.dispatch_end_s <= e.end_s + 1e-12
        took = e.dispatch_end_s - e.dispatch_start_s
        assert took == pytest.approx(costs.cost(plan.task(e.task_id)).dispatch_s, abs=1e-12)
    ahead = [e for e in strict if e.kind == "forward" and e.block >= 0
             and e.start_s - e.dispatch_start_s > 0.5 * (e.dispatch_end_s - e.dispatch_start_s)]
    assert ahead, "the forwards waiting for their weights were enqueued ahead of the GPU"
