"""Several ranks per host: one rank simulated on its share of the host, the host's memory
compared with every rank's, every rank's tokens counted, and a plan the profile cannot hold
refused by name."""

import pytest
from helpers import make_round_host, make_round_profile, make_tiny_model

from layerslide.kinds import Lane, TaskKind
from layerslide.planner import Policy, TrainSpec, build_plan
from layerslide.planner.plan import Task
from layerslide.planner.sharding import Shards
from layerslide.simulator import CostModel, simulate
from layerslide.simulator.bounds import bound_of
from layerslide.simulator.costmodel import INTERCONNECT
from layerslide.simulator.ranks import check_ranks, rank_share

GIB = 1024**3
K = TaskKind


def plan_of(gpus=1, hosts=1, model=None, **policy):
    train = TrainSpec(micro_batch=1, seq_len=16, grad_accum=2, gpus=gpus, hosts=hosts)
    return build_plan(model or make_tiny_model(), train,
                      Policy.of(accumulation="layer_major", **policy), num_steps=3)


def test_a_rank_gets_its_share_of_the_cores_memory_cpu_kernels_and_drives():
    host = make_round_host(gpus=4, gpus_per_link=2)
    share = rank_share(host, 4)
    assert share.host.cores == 2  # 8 cores, whole ones per rank
    assert share.host.memory_bytes_per_s == pytest.approx(1e15 / 4)
    assert share.host.adamw_params_per_s == pytest.approx(1e6 / 4)
    assert share.host.cast_bytes_per_s == pytest.approx(1e7 / 4)
    assert share.storage.read_bytes_per_s == pytest.approx(1e9 / 4)
    assert share.storage.write_bytes_per_s == pytest.approx(1e9 / 4)
    # two GPUs split each link; the GPU and its interconnect stay whole
    assert share.link.h2d_bytes_per_s == pytest.approx(0.5e9)
    assert share.link.duplex_bytes_per_s == pytest.approx(1e9)
    assert (share.gpu, share.interconnect) == (host.gpu, host.interconnect)
    assert rank_share(host, 1) is host


def test_a_ranks_costs_take_its_share_of_the_drives_link_and_cpu():
    host = make_round_host(gpus=4, gpus_per_link=4)
    whole, rank = CostModel(host, gpus=1), CostModel(host, gpus=4)

    def task(kind, lane, **amounts):
        return Task(id="t", kind=kind, lane=lane, block=0, step=0, **amounts)
    for t in (task(K.READ_STATE, Lane.NVME_READ, bytes=1e9),
              task(K.WRITE_STATE, Lane.NVME_WRITE, bytes=1e9),
              task(K.LOAD_WEIGHTS, Lane.H2D, bytes=1e9),
              task(K.OPTIMIZER_STEP, Lane.CPU, params=10**6)):
        assert rank.cost(t).solo_s == pytest.approx(4 * whole.cost(t).solo_s), t.kind


def test_a_link_split_between_more_gpus_than_run_gives_each_running_one_its_part():
    share = rank_share(make_round_host(gpus=4, gpus_per_link=4), 2)
    assert share.link.h2d_bytes_per_s == pytest.approx(0.5e9)


def test_more_gpus_per_host_than_the_profile_holds_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"runs 8 GPUs per host but profile round-x4 holds 4: "
                                         r"plan with --gpus 4 or fewer"):
        check_ranks(make_round_host(gpus=4), 8, 1)
    with pytest.raises(ValueError, match="runs 2 GPUs per host but profile round holds 1"):
        simulate(plan_of(gpus=2), make_round_profile())


def test_several_hosts_need_a_network():
    with pytest.raises(ValueError, match="on 2 hosts but profile round-x4 has no \\[network\\]"):
        check_ranks(make_round_host(gpus=4, network=None), 4, 2)


def test_each_rank_needs_a_core():
    with pytest.raises(ValueError, match="has 2 cores: each rank needs a core of its own"):
        check_ranks(make_round_host(gpus=4, cores=2), 4, 1)


def test_the_throughput_counts_every_ranks_tokens():
    plan = plan_of(gpus=4, hosts=2)
    pred = simulate(plan, make_round_host(gpus=4))
    assert pred.tokens_per_step == plan.train.global_tokens_per_step == 8 * 2 * 16
    assert pred.tokens_per_s == pytest.approx(pred.tokens_per_step / pred.step_s)
    assert (pred.ranks_per_host, pred.hosts, pred.ranks) == (4, 2, 8)
    flops = plan.model.training_flops_per_token(16) * pred.tokens_per_step / pred.step_s
    assert pred.mfu == pytest.approx(flops / (8 * 1e12))  # per GPU


def test_one_rank_costs_as_before():
    plan = plan_of()
    profile = make_round_profile()
    alone, one_of_one = CostModel(profile), CostModel(profile, gpus=1, hosts=1)
    assert all(alone.cost(t) == one_of_one.cost(t) for t in plan.tasks)
    assert alone.capacities() == one_of_one.capacities()


def test_the_cpu_step_takes_as_long_on_a_slice_at_a_share_of_the_rate():
    """A host's 2 ranks each update half of every block at half the AdamW rate: each CPU
    lane's work is one rank's alone, with the slices' padding."""
    model = make_tiny_model()
    one = simulate(plan_of(model=model), make_round_profile())
    two = simulate(plan_of(2, model=model), make_round_host(gpus=2))
    blocks = [model.block_params(b) for b in (-1, *range(model.num_layers), model.num_layers)]
    padded = sum(2 * Shards(p, 2).slice_numel for p in blocks) / sum(blocks)
    assert two.floors_s["lane:cpu"] == pytest.approx(one.floors_s["lane:cpu"] * padded)


def test_collectives_draw_on_the_interconnect():
    pred = simulate(plan_of(2), make_round_host(gpus=2))
    assert pred.floors_s[INTERCONNECT] > 0 and pred.floors_s["lane:gather"] > 0
    assert pred.lane_busy["reduce"] > 0


def test_the_host_tiers_hold_every_ranks_peak_and_each_gpu_its_own():
    profile = make_round_host(gpus=2)
    pred = simulate(plan_of(2), profile)
    assert pred.peak_bytes_per_host == {t: 2 * b for t, b in pred.peak_bytes.items()}
    assert pred.feasible
    # RAM for one rank's peak and a half: one rank would fit, the host's two do not
    tight = make_round_host(gpus=2, ram_bytes=int(1.5 * pred.peak_bytes["host"]))
    over = simulate(plan_of(2), tight)
    (host,) = [o for o in over.overflows if o.tier == "host"]
    assert host.need_bytes == 2 * pred.peak_bytes["host"] and host.ranks == 2
    assert "(2 ranks x" in str(host)
    assert simulate(plan_of(1), tight).feasible


def test_the_bound_is_the_largest_floor_named_as_a_resource():
    assert bound_of({"lane:gpu": 1.0, "interconnect": 2.0}, 4.0) == ("GPU interconnect", 0.5)
    assert bound_of({"host_memory": 3.0, "lane:cpu": 2.0}, 3.0) == ("host memory bandwidth",
                                                                   1.0)
    assert bound_of({}, 1.0) == (None, None)
    pred = simulate(plan_of(2), make_round_host(gpus=2))
    assert (pred.bound, pred.bound_share) == bound_of(pred.floors_s, pred.step_s)
    assert pred.summary()["bound"] == pred.bound
