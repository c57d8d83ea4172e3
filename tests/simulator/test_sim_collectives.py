"""The collectives' cost rules against hand-computed rings: bytes each rank sends, the ring's
steps' latency, which link carries them and what they draw on."""

import pytest
from helpers import ROUND_NETWORK, ROUND_NVLINK, make_round_host

from layerslide.hwprofiles import InterconnectSpec
from layerslide.kinds import Lane, TaskKind
from layerslide.planner.plan import Task
from layerslide.simulator import CostModel
from layerslide.simulator.collectives import group_ranks, ring_traffic
from layerslide.simulator.costmodel import HOST_MEMORY, INTERCONNECT, NETWORK, PCIE

K = TaskKind


def box(interconnect=ROUND_NVLINK, network=ROUND_NETWORK, gpus=4, gpus_per_link=1):
    return make_round_host(gpus, interconnect, network, gpus_per_link)


def collective(kind, nbytes, group="host"):
    lane = Lane.GATHER if kind == K.GATHER_WEIGHTS else Lane.REDUCE
    return Task(id="t", kind=kind, lane=lane, block=0, step=0, bytes=nbytes, comm_group=group)


def test_a_ring_sends_n_minus_1_over_n_of_the_buffer_and_twice_that_to_all_reduce():
    assert ring_traffic(K.GATHER_WEIGHTS, 4e9, 4) == (3e9, 3)
    assert ring_traffic(K.REDUCE_GRADS, 4e9, 4) == (3e9, 3)
    assert ring_traffic(K.ALL_REDUCE_GRADS, 4e9, 4) == (6e9, 6)
    assert ring_traffic(K.REDUCE_NORM, 4, 2) == (4, 2)
    assert ring_traffic(K.GATHER_WEIGHTS, 4e9, 1) == (0.0, 0)


def test_a_group_spans_the_hosts_ranks_one_rank_per_host_or_every_rank():
    assert [group_ranks(g, 4, 2) for g in ("host", "peers", "world")] == [4, 2, 8]
    with pytest.raises(ValueError, match="'rack' is not one of host, peers, world"):
        group_ranks("rack", 4, 2)


@pytest.mark.parametrize("kind", [K.GATHER_WEIGHTS, K.REDUCE_GRADS])
def test_over_nvlink_a_gather_or_scatter_is_its_steps_latency_and_its_bytes_at_the_rate(kind):
    cost = CostModel(box(), gpus=4).cost(collective(kind, 4e9))
    solo = 3 * 1e-5 + 3e9 / 100e9
    assert cost.solo_s == pytest.approx(solo)
    assert dict(cost.uses) == {INTERCONNECT: pytest.approx(3e9 / solo)}


def test_the_clipping_norm_is_an_all_reduce_of_four_bytes_mostly_latency():
    cost = CostModel(box(), gpus=4).cost(collective(K.REDUCE_NORM, 4))
    assert cost.solo_s == pytest.approx(6 * 1e-5 + 6 / 100e9)


def test_across_hosts_the_peers_share_their_hosts_network_cards():
    # 4 cards of 50e9 per host shared by its 4 ranks: 50e9 each; 2 hosts: 2 steps of 2e-5
    cost = CostModel(box(), gpus=4, hosts=2).cost(collective(K.ALL_REDUCE_GRADS, 1e9, "peers"))
    solo = 2 * 2e-5 + 1e9 / 50e9
    assert cost.solo_s == pytest.approx(solo)
    assert dict(cost.uses) == {NETWORK: pytest.approx(1e9 / solo)}
    assert CostModel(box(), gpus=4, hosts=2).capacities()[NETWORK] == pytest.approx(50e9)


def test_without_peer_to_peer_every_byte_crosses_the_link_both_ways_and_host_memory():
    staged = InterconnectSpec(kind="host")
    # two GPUs splitting one link: each rank's is 0.5e9 one way, 1e9 both
    costs = CostModel(box(staged, gpus=2, gpus_per_link=2), gpus=2)
    cost = costs.cost(collective(K.GATHER_WEIGHTS, 2e9))
    assert cost.solo_s == pytest.approx(1e9 / 0.5e9)
    assert dict(cost.uses) == {PCIE: pytest.approx(1e9), HOST_MEMORY: pytest.approx(1e9)}
    assert INTERCONNECT not in costs.capacities()


def test_a_host_staged_interconnect_given_a_rate_takes_the_lower_one():
    staged = InterconnectSpec(kind="host", bandwidth_bytes_per_s=0.25e9, latency_s=1e-3)
    cost = CostModel(box(staged, gpus=2), gpus=2).cost(collective(K.REDUCE_GRADS, 2e9))
    assert cost.solo_s == pytest.approx(1e-3 + 1e9 / 0.25e9)


def test_peer_to_peer_over_pcie_takes_both_gpus_links():
    p2p = InterconnectSpec(kind="pcie_p2p", bandwidth_bytes_per_s=0.8e9)
    cost = CostModel(box(p2p, gpus=2), gpus=2).cost(collective(K.GATHER_WEIGHTS, 2e9))
    assert cost.solo_s == pytest.approx(1e9 / 0.8e9)
    assert dict(cost.uses) == {INTERCONNECT: pytest.approx(0.8e9), PCIE: pytest.approx(1.6e9)}


def test_gpus_without_peer_to_peer_stage_their_network_bytes_through_host_memory():
    staged = InterconnectSpec(kind="host")
    costs = CostModel(box(staged, gpus=2), gpus=2, hosts=2)
    cost = costs.cost(collective(K.ALL_REDUCE_GRADS, 1e9, "peers"))
    # each rank's share of the network: 200e9 / 2; the link (1e9 one way) is slower
    assert cost.solo_s == pytest.approx(2 * 2e-5 + 1e9 / 1e9)
    assert set(dict(cost.uses)) == {NETWORK, PCIE, HOST_MEMORY}


def test_a_group_of_one_costs_nothing():
    cost = CostModel(box(), gpus=4, hosts=1).cost(collective(K.ALL_REDUCE_GRADS, 1e9, "peers"))
    assert cost.solo_s == 0 and cost.uses == ()
