"""Joining a torchrun launch: what the environment says, the refusals, and real ranks (gloo)
that agree on their shape, learn each other's failures and name a rank that was killed."""

import json
from pathlib import Path

import pytest
from ranks_helpers import Launched, free_port, host_args, torchrun

from layerslide.executor.engine import TaskFailedError
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.kinds import Lane
from layerslide.training import distributed
from layerslide.training.distributed import (
    backend,
    is_collective_failure,
    join,
    launched_ranks,
    rank_folders,
)


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


class _Dist:
    """torch.distributed as _init sees it: the rendezvous and the group's arguments."""

    def __init__(self):
        self.made = None

    def rendezvous(self, url, timeout):
        class Store:
            def set_timeout(self, timeout):
                pass
        yield Store(), 1, 2

    def init_process_group(self, backend, **options):
        self.made = (backend, options)


def test_on_gpus_the_group_is_bound_to_the_ranks_own_gpu(monkeypatch):
    import torch

    for kept in ("_store", "_timeout_s"):  # _init sets them: put back after the test
        monkeypatch.setattr(distributed, kept, getattr(distributed, kept))
    dist = _Dist()
    distributed._init(dist, "cuda", 30.0, local_rank=3)
    backend_made, options = dist.made
    assert backend_made == "cpu:gloo,cuda:nccl"
    assert options["device_id"] == torch.device("cuda", 3) and options["rank"] == 1
    distributed._init(dist, "cpu", 30.0, local_rank=3)
    assert "device_id" not in dist.made[1]


def test_every_group_waits_as_long_as_the_run_joined_with(monkeypatch):
    """Not torch's 30 minutes: a rank whose peer died hears of it within the run's timeout,
    on the lanes' groups and on the step logs' group alike."""
    from datetime import timedelta

    made = []

    class Groups:
        group = type("group", (), {"WORLD": "world"})

        def new_group(self, ranks, **options):
            made.append(options)
            return tuple(ranks)

    monkeypatch.setattr(distributed, "_timeout_s", 42.0)
    groups = distributed._groups(Groups(), 2, 2, rank=1)
    assert groups[(None, "step_logs")] == (0, 1, 2, 3)
    assert groups[(Lane.REDUCE, "host")] == (0, 1) and groups[(Lane.GATHER, "peers")] == (1, 3)
    assert len(made) > 4 and all(o["timeout"] == timedelta(seconds=42) for o in made)


# real ranks: torchrun on this machine, gloo (tests/training/ranks_probe.py)
PROBE = str(Path(__file__).with_name("ranks_probe.py"))


def probe_lines(out: str) -> list[dict]:
    return sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")),
                  key=lambda seen: seen["rank"])


def test_two_ranks_join_and_each_learns_the_others_failures():
    launched = Launched(torchrun("--standalone", "--nproc-per-node", "2", PROBE, "join"))
    status, out, err = launched.finish()
    assert status == 0, err
    seen = probe_lines(out)
    assert [(s["rank"], s["gpus"], s["hosts"]) for s in seen] == [(0, 2, 1), (1, 2, 1)]
    assert all(s["failures"] == {"1": "no data here"} for s in seen)  # rank 1's, on both
    assert [s["nvme"] for s in seen] == ["/a/rank0,/b/rank0", "/a/rank1,/b/rank1"]
    assert all(s["cores"] == max(1, s["affinity"] // 2) for s in seen)  # a host's cores shared


def test_leaving_ends_the_groups_threads_before_the_interpreter_exits():
    """A gloo worker still dropping a finished all-gather's tensors at interpreter exit needs
    the GIL there and aborts the rank (exit -6, 1 run in ~10 of a 2-rank train under load):
    leave() ends every group's threads while Python is whole."""
    launched = Launched(torchrun("--standalone", "--nproc-per-node", "2", PROBE, "leave"))
    status, out, err = launched.finish()
    assert status == 0, err
    for seen in probe_lines(out):  # each group has a worker thread or more, and a transport's
        groups = 1 + len(distributed.COLLECTIVE_LANES) * 2 + 1
        assert seen["threads_joined"] - seen["threads_left"] >= groups, seen


def test_hosts_that_launch_different_rank_counts_are_refused_on_every_rank():
    port = free_port()
    hosts = [Launched(torchrun(*host_args(2, host, port, per_host=host + 1), PROBE, "join"))
             for host in (0, 1)]
    said = [host.finish() for host in hosts]
    assert all(status != 0 for status, _, _ in said)
    refusals = "".join(err for _, _, err in said)
    assert refusals.count("the hosts launched different numbers of ranks (LOCAL_WORLD_SIZE "
                          "rank 0: 1, rank 1: 2, rank 2: 2)") == 3  # each rank, none waiting


def test_the_ranks_left_after_one_is_killed_name_it_in_the_roll_call():
    launched = Launched(torchrun("--standalone", "--nproc-per-node", "3", PROBE, "die"))
    status, out, _ = launched.finish()
    assert status != 0  # torchrun reports the killed rank
    assert [(s["rank"], s["unanswered"]) for s in probe_lines(out)] == [(0, [1]), (2, [1])]


def test_a_ranks_nvme_folders_are_its_own_on_every_drive():
    assert rank_folders("/n0/ls,/n1/ls", Ranks(rank=3, gpus=2, hosts=2)) == \
        "/n0/ls/rank3,/n1/ls/rank3"
    assert rank_folders("/n0/ls", SINGLE) == "/n0/ls"  # one rank: the folder as given


def test_a_collective_failure_is_told_from_a_ranks_own_error():
    gone = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
                        "by peer [127.0.0.1]:5558")
    try:
        raise TaskFailedError("task s0.m0.gather_weights.l0 failed") from gone
    except TaskFailedError as err:
        assert is_collective_failure(err)
    assert is_collective_failure(RuntimeError("Application timeout caused pair closure"))
    assert not is_collective_failure(TaskFailedError("task failed: CUDA out of memory"))
    assert not is_collective_failure(ValueError("--data: no such file"))
