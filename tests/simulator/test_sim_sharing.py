"""water_fill and SharedResources: fluid sharing of host memory bandwidth, the CPU's cores,
PCIe and the disk, checked against the contention measured on the H200 benchmark machine
(benchmarks/results/archive/sharing_2026-11-30)."""

from __future__ import annotations

import random

import pytest
import simpy

from layerslide.hwprofiles import load_profile
from layerslide.planner import Task
from layerslide.simulator import CostModel
from layerslide.simulator.costmodel import HOST_CORES, HOST_MEMORY, NVME, PCIE, Cost
from layerslide.simulator.kernel import Kernel
from layerslide.simulator.sharing import SharedResources, water_fill

GIB = 1024**3


# --- water_fill --------------------------------------------------------------------------------
def test_under_capacity_everyone_runs_at_full_speed():
    assert water_fill([1.0, 2.0, 3.0], [1.0, 0.5, 0.8], 6.0) == [1.0, 1.0, 1.0]
    assert water_fill([5.0], [1.0], 100.0) == [1.0]


def test_equal_weights_get_equal_fractions():
    assert water_fill([10.0, 10.0], [1.0, 1.0], 10.0) == pytest.approx([0.5, 0.5])
    # fractions of each one's demand, not equal absolute shares: 20 of 30 asked for
    assert water_fill([10.0, 20.0], [0.8, 0.8], 20.0) == pytest.approx([2 / 3, 2 / 3])


def test_weighted_fractions():
    # fraction = lam * weight: 10*2*lam + 10*lam = 6  ->  lam = 0.2
    assert water_fill([10.0, 10.0], [2.0, 1.0], 6.0) == pytest.approx([0.4, 0.2])


def test_one_consumer_saturates_and_the_rest_share_what_is_left():
    # lam = 12 / (2*4 + 10 + 10) = 0.43 gives the first 1.71 > 1: it saturates at 1 (2 units),
    # and the other two share 10 units of 20 asked: 0.5 each.
    assert water_fill([2.0, 10.0, 10.0], [4.0, 1.0, 1.0], 12.0) == pytest.approx([1.0, 0.5, 0.5])


def test_a_consumer_that_asks_for_nothing_runs_at_its_full_rate():
    # a copy whose host-memory cost was fitted at 0 shares nothing with AdamW there
    assert water_fill([10.0, 0.0], [1.0, 0.1], 5.0) == pytest.approx([0.5, 1.0])


def test_oversubscribed_grants_exactly_the_capacity():
    rng = random.Random(1234)
    for _ in range(200):
        n = rng.randint(2, 6)
        demands = [rng.uniform(0.1, 10.0) for _ in range(n)]
        weights = [rng.uniform(0.1, 2.0) for _ in range(n)]
        capacity = rng.uniform(0.1, 0.99) * sum(demands)
        fractions = water_fill(demands, weights, capacity)
        assert all(0.0 < f <= 1.0 for f in fractions)
        assert sum(d * f for d, f in zip(demands, fractions)) == pytest.approx(capacity, rel=1e-9)
        # water level: everyone below 1 has fraction / weight equal to the same lam, and
        # anyone saturated would have had at least that
        unsaturated = [f / w for f, w in zip(fractions, weights) if f < 1.0]
        assert unsaturated and max(unsaturated) == pytest.approx(min(unsaturated), rel=1e-9)
        for f, w in zip(fractions, weights):
            if f == 1.0:
                assert w * unsaturated[0] >= 1.0 - 1e-9


# --- SharedResources: the rates it keeps --------------------------------------------------------
class _CheckedShares(SharedResources):
    """SharedResources checking after each change that every flow runs at its tightest share,
    resharing every resource from scratch (it reshares only those a change touched, and skips
    one short neither before nor after)."""

    def run(self, *args, **kwargs):
        done = super().run(*args, **kwargs)
        self.check()
        return done

    def _on_timer(self, timer):
        super()._on_timer(timer)
        self.check()

    def check(self):
        rates = dict.fromkeys(self.flows, 1.0)
        for resource, members in self.members.items():
            if members:
                fractions = water_fill([d for _, d in members], [f.share for f, _ in members],
                                       self.capacities[resource])
                for (f, _), x in zip(members, fractions, strict=True):
                    rates[f] = min(rates[f], x)
        assert {f: f.rate for f in self.flows} == rates


@pytest.mark.parametrize("seed", range(6))
def test_flows_run_at_their_tightest_share_as_resources_go_short_and_back(seed):
    rng = random.Random(seed)
    env = Kernel()
    shared = _CheckedShares(env, {"a": 1.0, "b": 2.0, "c": 0.5})
    ended = []

    def flow(delay):
        yield env.timeout(delay)
        uses = [(r, rng.uniform(0.05, 1.5)) for r in rng.sample("abc", rng.randint(1, 2))]
        yield shared.run(rng.uniform(0.01, 1.0), uses, rng.uniform(0.5, 2.0))
        ended.append(env.now)

    for _ in range(60):
        env.process(flow(rng.uniform(0.0, 5.0)))
    env.run()
    assert len(ended) == 60 and not shared.flows


# --- SharedResources on the h200-bench capacities -------------------------------------------
def _h200_taking_turns():
    """h200-bench with its disk's reads and writes taking turns (no storage.duplex): what
    these tests derive by hand."""
    import dataclasses

    base = load_profile("h200-bench")
    return dataclasses.replace(base, storage=dataclasses.replace(
        base.storage, duplex_bytes_per_s=None, duplex_read_share=None))


@pytest.fixture(scope="module")
def costs():
    return CostModel(_h200_taking_turns())


def _task(kind: str, lane: str, **amounts) -> Task:
    return Task(id=f"probe.{kind}", kind=kind, lane=lane, block=0, step=0, **amounts)


def _start(env, shared, cost, log, name):
    def proc():
        start = env.now
        yield shared.run(cost.solo_s, cost.uses, cost.share)
        log[name] = (start, env.now)
    return env.process(proc())


def _side_by_side(costs, first, second):
    """Each task's (start, end), both started at 0 on the profile's shared resources."""
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities())
    log: dict[str, tuple[float, float]] = {}
    _start(env, shared, first, log, "first")
    _start(env, shared, second, log, "second")
    env.run()
    return log


def test_capacities_come_from_the_profile(costs):
    assert costs.capacities() == {HOST_MEMORY: 133.0e9, PCIE: 100e9, NVME: 1.0,
                                  HOST_CORES: 16.0}


def test_cpu_kernels_take_every_core_and_a_dispatch_the_profiles_share(costs):
    import dataclasses

    adamw = costs.cost(_task("optimizer_step", "cpu", params=10**8))
    cast = costs.cost(_task("cast", "cpu", bytes=10**9))
    forward = costs.cost(_task("forward", "gpu", flops=1e12, tokens=1024, host_ops=100))
    assert (HOST_CORES, 16.0) in adamw.uses and (HOST_CORES, 16.0) in cast.uses
    assert forward.dispatch_uses == ((HOST_CORES, 1.0),)  # h200-bench: no measured share
    profile = costs.profile
    measured = dataclasses.replace(profile, host=dataclasses.replace(profile.host,
                                                                     dispatch_cores=2.5))
    assert CostModel(measured).cost(
        _task("forward", "gpu", flops=1e12, tokens=1024, host_ops=100)).dispatch_uses == (
        (HOST_CORES, 2.5),)
    # no kernels to launch, nothing drawn
    assert costs.cost(_task("forward", "gpu", flops=1e12, tokens=1024)).dispatch_uses == ()


def test_adamw_and_a_cast_on_two_workers_split_the_cores(costs):
    # both kernels run a thread on every core: at once, each gets half of them (H200
    # benchmarks/results/h200_cpu_probe_2026-11-29: 16 + 16 threads, AdamW 3.99 -> 2.09 Gparam/s)
    adamw = costs.cost(_task("optimizer_step", "cpu", params=10**8))
    cast = costs.cost(_task("cast", "cpu_cast", bytes=adamw.solo_s * 48.9e9))
    assert cast.solo_s == pytest.approx(adamw.solo_s)
    log = _side_by_side(costs, adamw, cast)
    assert log["first"][1] == pytest.approx(2 * adamw.solo_s, rel=1e-9)
    assert log["second"][1] == pytest.approx(2 * cast.solo_s, rel=1e-9)


def test_a_dispatching_thread_takes_its_core_from_adamw(costs):
    # 16 AdamW threads and one launching kernels ask 17 cores of 16: each flow runs at 16/17
    adamw = costs.cost(_task("optimizer_step", "cpu", params=10**8))
    dispatch_s = adamw.solo_s / 2
    dispatch = Cost(solo_s=dispatch_s, uses=((HOST_CORES, 1.0),))
    log = _side_by_side(costs, adamw, dispatch)
    assert log["second"][1] == pytest.approx(dispatch_s * 17 / 16, rel=1e-9)
    # AdamW did 16/17 of the dispatch's time at 16/17 speed, then the rest alone
    assert log["first"][1] == pytest.approx(adamw.solo_s + dispatch_s * 17 / 16 / 17, rel=1e-9)


def _adamw_beside_copies(costs, copy):
    """AdamW over 256 M params while 1 GiB copies of one direction run back to back, as in
    benchmarks/probes/host_sharing_probe.py: (AdamW's, the first copy's) share of its solo rate."""
    adamw = costs.cost(_task("optimizer_step", "cpu", params=256_000_000))
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities())
    log: dict[str, tuple[float, float]] = {}
    _start(env, shared, adamw, log, "adamw")

    def copies():
        i = 0
        while "adamw" not in log:
            start = env.now
            yield shared.run(copy.solo_s, copy.uses, copy.share)
            log[f"copy{i}"] = (start, env.now)
            i += 1

    env.process(copies())
    env.run()
    adamw_kept = adamw.solo_s / (log["adamw"][1] - log["adamw"][0])
    return adamw_kept, copy.solo_s / (log["copy0"][1] - log["copy0"][0])


def test_adamw_and_h2d_slow_each_other_as_measured(costs):
    # sharing_2026-11-30: beside H2D, AdamW kept 0.87 of its rate and H2D 0.70 (38.1 of 54.7);
    # the profile's fit took each call's fixed time out, which the simulator slows with the
    # rest of the task: 0.89 and 0.72
    h2d = costs.cost(_task("load_weights", "h2d", bytes=GIB))
    assert h2d.solo_s == pytest.approx(GIB / 55.4e9)
    adamw_kept, h2d_kept = _adamw_beside_copies(costs, h2d)
    assert adamw_kept == pytest.approx(0.87, abs=0.025)
    assert h2d_kept == pytest.approx(0.70, abs=0.025)


def test_d2h_keeps_its_rate_and_slows_adamw_as_measured(costs):
    # sharing_2026-11-30: beside D2H, AdamW kept 0.71 of its rate and D2H all of it
    d2h = costs.cost(_task("offload_grads", "d2h", bytes=GIB))
    adamw_kept, d2h_kept = _adamw_beside_copies(costs, d2h)
    assert adamw_kept == pytest.approx(0.71, abs=0.02)
    assert d2h_kept == pytest.approx(1.0, abs=0.01)


def test_h2d_and_d2h_together_move_the_measured_duplex(costs):
    # 55.4 + 55.3 GB/s asked of a 100 GB/s link; the D2H's weight (1.4 against 0.8) keeps it at
    # its full rate, the H2D moves the rest (measured both at once: D2H 51.7, H2D 46.6 GB/s)
    h2d = costs.cost(_task("load_weights", "h2d", bytes=GIB))
    d2h = costs.cost(_task("offload_grads", "d2h", bytes=GIB))
    log = _side_by_side(costs, h2d, d2h)
    assert log["second"][1] == pytest.approx(GIB / 55.3e9, rel=1e-9)
    h2d_while_both = 100e9 - 55.3e9
    h2d_left = GIB - log["second"][1] * h2d_while_both  # then alone at its full rate
    assert log["first"][1] == pytest.approx(log["second"][1] + h2d_left / 55.4e9, rel=1e-9)


def test_disk_reads_and_writes_take_turns(costs):
    # read and write 1 s of bytes alone each: each gets half of the device's time, so both
    # end at 2 s
    disk = costs.profile.storage
    read = costs.cost(_task("read_state", "nvme_read", bytes=disk.read_bytes_per_s))
    write = costs.cost(_task("write_state", "nvme_write", bytes=disk.write_bytes_per_s))
    assert read.solo_s == pytest.approx(1.0) and write.solo_s == pytest.approx(1.0)
    log = _side_by_side(costs, read, write)
    assert log["first"] == pytest.approx((0.0, 2.0), rel=1e-9)
    assert log["second"] == pytest.approx((0.0, 2.0), rel=1e-9)


def test_disk_alone_runs_at_its_solo_speed_and_a_late_task_shares_the_rest(costs):
    # a 1 s read; a 1 s write starts at 0.5 s: the read has 0.5 s of work left, done at half
    # speed -> ends at 1.5 s; the write did 0.5 s of its work by then, the rest alone -> 2.0 s
    disk = costs.profile.storage
    read = costs.cost(_task("read_state", "nvme_read", bytes=disk.read_bytes_per_s))
    write = costs.cost(_task("write_state", "nvme_write", bytes=disk.write_bytes_per_s))
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities())
    log: dict[str, tuple[float, float]] = {}
    _start(env, shared, read, log, "read")

    def later():
        yield env.timeout(0.5)
        yield _start(env, shared, write, log, "write")

    env.process(later())
    env.run()
    assert log["read"][1] == pytest.approx(1.5, rel=1e-9)
    assert log["write"] == pytest.approx((0.5, 2.0), rel=1e-9)


def test_a_disk_with_a_measured_duplex_rate_moves_that_much_reading_and_writing_at_once():
    """storage.duplex: reads and writes at once move that many bytes/s together (the H200
    machine's disk moved 1.79 GB/s in the 14B run where taking turns gives 2.095); reads alone
    and writes alone keep their own rates."""
    import dataclasses

    base = _h200_taking_turns()
    r, w, duplex = 1.92e9, 2.27e9, 1.79e9
    profile = dataclasses.replace(base, storage=dataclasses.replace(
        base.storage, read_bytes_per_s=r, write_bytes_per_s=w, duplex_bytes_per_s=duplex))
    costs = CostModel(profile)
    assert costs.mixed_capacities() == {NVME: pytest.approx(duplex / 2 / r + duplex / 2 / w)}
    assert CostModel(base).mixed_capacities() == {}  # not given: they take turns
    read = costs.cost(_task("read_state", "nvme_read", bytes=10 * r))  # 10 s alone
    write = costs.cost(_task("write_state", "nvme_write", bytes=10 * w))
    assert (read.tag, write.tag) == ("read", "write")
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities(), costs.mixed_capacities())
    log: dict[str, tuple[float, float]] = {}

    def run(cost, name, delay_s=0.0):
        def proc():
            yield env.timeout(delay_s)
            start = env.now
            yield shared.run(cost.solo_s, cost.uses, cost.share, cost.tag)
            log[name] = (start, env.now)
        env.process(proc())

    # the same bytes each way at once: the disk splits its bytes evenly (the H200 machine's
    # traces: reads ran ahead of writes, though alone they are the slower), so each moves
    # duplex / 2 and they end together
    same = 10e9
    run(costs.cost(_task("read_state", "nvme_read", bytes=same)), "read")
    run(costs.cost(_task("write_state", "nvme_write", bytes=same)), "write")
    env.run()
    assert log["read"][1] == pytest.approx(2 * same / duplex, rel=1e-9)
    assert log["write"][1] == pytest.approx(2 * same / duplex, rel=1e-9)
    # two reads at once are not mixed: they share the device's time as before
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities(), costs.mixed_capacities())
    log.clear()
    run(read, "a")
    run(read, "b")
    env.run()
    assert log["a"][1] == pytest.approx(20.0, rel=1e-9)


def _disk_ends(costs: CostModel, **bytes_of_kind: float) -> dict[str, float]:
    """When each disk task ends, all started at once (one per lane: nvme_read, nvme_write)."""
    env = simpy.Environment()
    shared = SharedResources(env, costs.capacities(), costs.mixed_capacities())
    ends: dict[str, float] = {}

    def run(lane, nbytes):
        kind = "read_state" if lane == "nvme_read" else "write_state"
        cost = costs.cost(_task(kind, lane, bytes=nbytes))
        yield shared.run(cost.solo_s, cost.uses, cost.share, cost.tag)
        ends[lane] = env.now

    for lane, nbytes in bytes_of_kind.items():
        env.process(run(lane, nbytes))
    env.run()
    return ends


def test_a_disk_whose_reads_take_60_percent_of_the_duplex_bytes_ends_them_sooner():
    """storage.duplex_read_share: the NVMe tier's reads took ~60% of the bytes beside its
    writes on the H200 machine; the same bytes each way then end at duplex * 0.6 and 0.4."""
    import dataclasses

    base = _h200_taking_turns()
    r, w, duplex, part = 1.67e9, 1.97e9, 1.8e9, 0.6
    profile = dataclasses.replace(base, storage=dataclasses.replace(
        base.storage, read_bytes_per_s=r, write_bytes_per_s=w, duplex_bytes_per_s=duplex,
        duplex_read_share=part))
    costs = CostModel(profile)
    assert costs.duplex_split() == pytest.approx((part * duplex, (1 - part) * duplex))
    same = 9e9
    ends = _disk_ends(costs, nvme_read=same, nvme_write=same)
    read_end = same / (part * duplex)  # 8.33 s; then the write runs alone at w
    left = same - (1 - part) * duplex * read_end
    assert ends["nvme_read"] == pytest.approx(read_end, rel=1e-9)
    assert ends["nvme_write"] == pytest.approx(read_end + left / w, rel=1e-9)


def test_where_the_slower_direction_cannot_take_half_the_duplex_rate_the_faster_takes_the_rest():
    """read 7, write 2, duplex 5 GB/s: the write runs at its full 2 GB/s and the read gets the
    other 3, never more than the 5 the disk moves together."""
    import dataclasses

    base = _h200_taking_turns()
    profile = dataclasses.replace(base, storage=dataclasses.replace(
        base.storage, read_bytes_per_s=7e9, write_bytes_per_s=2e9, duplex_bytes_per_s=5e9))
    costs = CostModel(profile)
    ends = _disk_ends(costs, nvme_read=30e9, nvme_write=20e9)  # 10 s at 3 and at 2 GB/s
    assert ends == {"nvme_read": pytest.approx(10.0, rel=1e-9),
                    "nvme_write": pytest.approx(10.0, rel=1e-9)}


def test_a_disk_read_draws_host_memory_as_a_d2h_and_a_write_as_an_h2d():
    """The disk's DMA writes host memory on a read and reads it on a write."""
    import dataclasses

    base = _h200_taking_turns()
    profile = dataclasses.replace(base, host=dataclasses.replace(
        base.host, dma_read_cost=0.25, dma_write_cost=0.75))
    costs = CostModel(profile)
    r, w = profile.storage.read_bytes_per_s, profile.storage.write_bytes_per_s
    read = costs.cost(_task("read_state", "nvme_read", bytes=1e9))
    write = costs.cost(_task("write_state", "nvme_write", bytes=1e9))
    assert dict(read.uses)[HOST_MEMORY] == pytest.approx(0.75 * r)
    assert dict(write.uses)[HOST_MEMORY] == pytest.approx(0.25 * w)


def test_the_duplex_split_needs_a_measured_duplex_rate():
    with pytest.raises(ValueError, match="storage.duplex is not given"):
        CostModel(_h200_taking_turns()).duplex_split()


def test_striped_drives_move_their_bytes_in_a_share_of_the_time():
    """Four drives alike: the tier stripes every file over them, so a read, a write and a
    read beside a write take a quarter of one drive's time, and the DMA into host memory
    runs four times as fast."""
    base = load_profile("h200-bench")
    one, four = CostModel(base), CostModel(base.with_overrides(nvme_drives=4))
    for kind, lane in (("read_state", "nvme_read"), ("write_state", "nvme_write")):
        alone, striped = (c.cost(_task(kind, lane, bytes=8e9)) for c in (one, four))
        assert striped.solo_s == pytest.approx(alone.solo_s / 4)
        assert dict(striped.uses)[HOST_MEMORY] == pytest.approx(4 * dict(alone.uses)[HOST_MEMORY])
    assert four.mixed_capacities() == pytest.approx(one.mixed_capacities())  # time fractions
    assert [x * 4 for x in one.duplex_split()] == pytest.approx(list(four.duplex_split()))
