"""Joining a torchrun launch: what the environment says, and the refusals."""

import pytest

from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.kinds import Lane
from layerslide.training.distributed import backend, join, launched_ranks


def test_outside_torchrun_the_run_is_one_rank():
    assert launched_ranks({}) is None
    assert join("cpu", environ={}) is SINGLE and SINGLE.world == 1 and SINGLE.is_first


def test_torchrun_variables_give_rank_gpus_and_hosts():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert launched_ranks(env) == (5, 4, 2)
    ranks = Ranks(rank=5, gpus=4, hosts=2)
    assert (ranks.local_rank, ranks.host, ranks.is_first) == (1, 1, False)


def test_uneven_hosts_and_bad_numbers_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="same --nproc-per-node"):
        launched_ranks({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="torchrun --nproc-per-node"):
        launched_ranks({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="rank must be in 0..3"):
        Ranks(rank=4, gpus=2, hosts=2)


def test_a_missing_group_names_what_was_set_up():
    with pytest.raises(ValueError, match="no process group for 'peers'"):
        Ranks(rank=0, gpus=2).group(Lane.REDUCE, "peers")


def test_gloo_on_the_cpu_nccl_beside_it_on_gpus():
    assert backend("cpu") == "gloo" and backend("cuda") == "cpu:gloo,cuda:nccl"
