"""simulator.kernel against SimPy: the same processes see the same events in the same order at
the same times (the engine's traces rest on that order where events tie)."""

from __future__ import annotations

import random

import pytest
import simpy

from layerslide.simulator.kernel import Kernel


def _script(env, seed: int) -> list:
    """Processes that wait on timeouts (many tied), on each other's events, on all-of and `&`
    conditions, trigger events for one another and start others (which start before the
    events of their instant); the log of what each saw, when."""
    rng = random.Random(seed)
    log: list = []
    flags = [env.event() for _ in range(12)]

    def child(name: tuple):
        log.append((env.now, name, "started"))
        yield env.timeout(0.0)
        log.append((env.now, name, "done"))

    def worker(name: int):
        for step in range(8):
            choice = rng.random()
            if choice < 0.1:
                env.process(child((name, step)))
            elif choice < 0.35:
                yield env.timeout(rng.choice((0.0, 0.5, 1.0, rng.random())))
            elif choice < 0.55:
                yield env.all_of(rng.sample(flags, rng.randint(0, 3)))
            elif choice < 0.7:
                a, b = rng.sample(flags, 2)
                yield a & b
            else:
                flag = flags[rng.randrange(len(flags))]
                if not flag.triggered:
                    flag.succeed()
            log.append((env.now, name, step))

    def releaser():  # every flag triggered in the end: no process waits for ever
        for flag in flags:
            yield env.timeout(0.25)
            if not flag.triggered:
                flag.succeed()
            log.append((env.now, "releaser"))

    for name in range(6):
        env.process(worker(name))
    env.process(releaser())
    env.run()
    return log


@pytest.mark.parametrize("seed", range(20))
def test_processes_see_the_events_in_simpys_order(seed):
    theirs = _script(simpy.Environment(), seed)
    ours = _script(Kernel(), seed)
    assert len(ours) > 40
    assert ours == theirs
    assert [type(t) for t, *_ in ours] == [type(t) for t, *_ in theirs]  # 0 before any timeout


def test_an_event_triggers_once():
    env = Kernel()
    event = env.event().succeed()
    with pytest.raises(RuntimeError):
        event.succeed()


def test_a_plan_runs_alike_on_simpy_and_on_the_kernel():
    from layerslide.hwprofiles import load_profile
    from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
    from layerslide.simulator import CostModel, run_plan

    plan = build_plan(PRESETS["llama-3.2-1b"], TrainSpec(micro_batch=2, grad_accum=2),
                      Policy.of(moments_on_nvme=0.5, gpu_updated_blocks=2))
    costs = CostModel(load_profile("h100-pcie"))
    theirs = run_plan(plan, costs, environment=simpy.Environment)
    ours = run_plan(plan, costs)
    assert len(ours.events) == plan.graph.number_of_nodes()
    assert (ours.events, ours.memory, ours.meta) == (theirs.events, theirs.memory, theirs.meta)
