"""Ranks of a run launched by torchrun: the process groups, made in the main thread first.

torchrun (or `torch.distributed.run`) sets RANK, WORLD_SIZE and LOCAL_WORLD_SIZE and the
rendezvous; this module joins it and makes every process group the run's collectives use
before any lane thread starts (group creation is not thread-safe, and every rank must create
every group, in one order). Collectives on the CPU go through gloo, on the GPU through NCCL.
It also keeps the launch's store (torch's own rendezvous store), where the ranks left after a
failure answer a roll call that names the ranks which did not.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.kinds import Lane

# How long a collective waits for the other ranks before it fails the run with their names:
# long enough for a checkpoint write or a slow first compile on one rank, short enough that a
# dead rank does not leave the others hanging.
DEFAULT_TIMEOUT_S = 600
COLLECTIVE_LANES = (Lane.GATHER, Lane.REDUCE)
# How long the ranks left after a failure wait for each other's answer to the roll call: a
# rank that died or was killed never answers; one stuck in a collective answers once it fails.
ROLL_CALL_S = 10.0
_ROLL_CALL_KEY = "layerslide/roll-call/"

_store = None  # the launch's c10d store, once joined
_timeout_s = DEFAULT_TIMEOUT_S  # the collectives' timeout the run joined with


def under_torchrun(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether torchrun (or torch.distributed.run) started this process as one of its ranks."""
    return "RANK" in environ and "WORLD_SIZE" in environ


def launched_ranks(environ: Mapping[str, str] = os.environ) -> tuple[int, int, int] | None:
    """(rank, gpus per host, hosts) as torchrun set them, or None outside torchrun."""
    if not under_torchrun(environ):
        return None
    rank, world = _whole(environ, "RANK"), _whole(environ, "WORLD_SIZE")
    per_host = _whole(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world
    if per_host < 1 or world % per_host:
        raise ValueError(f"WORLD_SIZE={world} is not a whole number of hosts of "
                         f"LOCAL_WORLD_SIZE={per_host} ranks: give every host the same "
                         "--nproc-per-node")
    return rank, per_host, world // per_host


def _whole(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_WORLD_SIZE must be whole numbers, as "
                         "torchrun sets them; launch with torchrun --nproc-per-node N -m "
                         f"layerslide train ... ({name}={environ[name]!r})") from None


def backend(device_type: str) -> str:
    """gloo for CPU tensors (and the CPU's totals), NCCL for CUDA ones."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def join(device_type: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
         environ: Mapping[str, str] = os.environ) -> Ranks:
    """Join the run torchrun launched and make its process groups (SINGLE outside torchrun).
    Every rank checks that all hosts launched as many ranks, after joining: a host refused
    alone would leave the others waiting for it."""
    import torch.distributed as dist

    if not under_torchrun(environ):
        return SINGLE
    rank, world = _whole(environ, "RANK"), _whole(environ, "WORLD_SIZE")
    per_host = _whole(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world
    if not dist.is_initialized():
        local = _whole(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0
        _init(dist, device_type, timeout_s, local)
    gpus = _agreed_ranks_per_host(per_host)
    hosts = world // gpus
    return Ranks(rank=rank, gpus=gpus, hosts=hosts, groups=_groups(dist, gpus, hosts, rank))


def _init(dist, device_type: str, timeout_s: float, local_rank: int = 0) -> None:
    """The default process group, through torch's env:// rendezvous (torchrun's store), whose
    store this module keeps for the roll call. On GPUs it is bound to this rank's GPU, so that
    NCCL makes its communicators there at once instead of guessing the device later."""
    global _store, _timeout_s
    timeout = timedelta(seconds=timeout_s)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    bound = {}
    if device_type == "cuda":
        import torch

        bound["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend(device_type), store=store, rank=rank, world_size=world,
                            timeout=timeout, **bound)
    _store, _timeout_s = store, timeout_s


def _agreed_ranks_per_host(mine: int) -> int:
    """The ranks per host, as every rank's LOCAL_WORLD_SIZE says it; refused on every rank
    where hosts launched different numbers."""
    everyone = gathered(mine)
    if len(set(everyone)) > 1:
        by_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(everyone))
        raise ValueError(f"the hosts launched different numbers of ranks (LOCAL_WORLD_SIZE "
                         f"{by_rank}): give every host's torchrun the same --nproc-per-node")
    return mine


def joined() -> bool:
    """Whether this process has joined a run's process group."""
    import torch.distributed as dist

    return dist.is_initialized()


def gathered(value) -> list:
    """Every rank's value (a small picklable object), by rank: a collective of the main
    thread, on the CPU."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def _groups(dist, gpus: int, hosts: int, rank: int) -> dict:
    """Every group, made by every rank in the same order; each rank keeps those it is in."""
    timeout = timedelta(seconds=_timeout_s)  # the run's, not torch's 30 minutes
    # the step logs' losses are summed by a thread of their own, beside the main thread's
    mine: dict = {(None, "world"): dist.group.WORLD,
                  (None, "step_logs"): dist.new_group(list(range(gpus * hosts)), backend="gloo",
                                                      timeout=timeout)}
    spans = {"host": [list(range(h * gpus, (h + 1) * gpus)) for h in range(hosts)],
             "peers": [list(range(g, gpus * hosts, gpus)) for g in range(gpus)]}
    for lane in COLLECTIVE_LANES:
        for name, members in spans.items():
            for ranks in members:
                group = dist.new_group(ranks, timeout=timeout)
                if rank in ranks:
                    mine[(lane, name)] = group
    return mine


def failures(ranks: Ranks, failure: str | None) -> dict[int, str]:
    """Each rank's failure (None: it passed) of a step every rank takes, by rank, learnt by
    every rank: so that all go on together or all stop, none left waiting at a collective."""
    if ranks.world == 1:
        return {} if failure is None else {0: failure}
    return {r: said for r, said in enumerate(gathered(failure)) if said is not None}


def cores_per_rank(ranks: Ranks) -> int:
    """The CPU cores this rank's kernels should use: those it may run on, shared with the
    ranks of its host that may run on them too (all of them, unless torchrun's --numa-binding
    or taskset gave each its own)."""
    mine = os.sched_getaffinity(0)
    if ranks.world == 1:
        return len(mine)
    sharing = sum(1 for host, cpus in gathered((ranks.host, sorted(mine)))
                  if host == ranks.host and mine & set(cpus))
    return max(1, len(mine) // sharing)


def roll_call_s() -> float:
    """How long the roll call waits: ROLL_CALL_S, or the collectives' timeout if shorter."""
    return min(ROLL_CALL_S, _timeout_s)


def is_collective_failure(error: BaseException) -> bool:
    """Whether an error (or one it was raised from) is a collective's or the process group's
    failure: another rank's doing, or the network's, rather than this rank's own. gloo raises
    plain RuntimeErrors, known by their words."""
    import torch.distributed as dist

    while error is not None:
        if isinstance(error, dist.DistError) or (
                isinstance(error, RuntimeError) and any(
                    words in str(error) for words in _COLLECTIVE_FAILURE_WORDS)):
            return True
        error = error.__cause__ or error.__context__
    return False


# what gloo's and NCCL's failures say (a peer gone, a timeout)
_COLLECTIVE_FAILURE_WORDS = ("gloo/transport", "pair closure", "Connection closed by peer",
                             "NCCL", "ProcessGroup")


def unanswered(ranks: Ranks, window_s: float = ROLL_CALL_S) -> list[int]:
    """After a failure: the ranks that do not answer a roll call in the launch's store within
    window_s (dead, killed, or still stuck in a collective), this rank's answer given first.
    Raises RuntimeError where the store itself is gone (the host of torchrun's rendezvous)."""
    if ranks.world == 1 or _store is None:
        return []
    _store.set_timeout(timedelta(seconds=window_s))
    _store.set(f"{_ROLL_CALL_KEY}{ranks.rank}", "here")
    silent, deadline = set(range(ranks.world)) - {ranks.rank}, time.monotonic() + window_s
    while silent and time.monotonic() < deadline:
        silent = {r for r in silent if not _store.check([f"{_ROLL_CALL_KEY}{r}"])}
        time.sleep(0.05)
    return sorted(silent)


def rank_folders(nvme_dir: str, ranks: Ranks) -> str:
    """A rank's own NVMe folders: each drive's folder's `rank<r>` (the folder itself for a run
    of one rank), so that ranks sharing a drive never share a file or a lock."""
    if ranks.world == 1:
        return nvme_dir
    from layerslide.executor.nvme import nvme_folders

    return ",".join(str(Path(folder) / f"rank{ranks.rank}") for folder in nvme_folders(nvme_dir))


def leave(ranks: Ranks) -> None:
    """Tear the process groups down (each rank, at the run's end) and let go of `ranks`'s, so
    that their worker threads end now: one still dropping a finished all-gather's tensors at
    interpreter exit needs the GIL there and aborts the process (torch frees a group without
    the GIL, joining its threads)."""
    import torch.distributed as dist

    global _store
    if dist.is_initialized():
        dist.destroy_process_group()
    ranks.groups.clear()
    gc.collect()  # any cycle that still holds a group
    _store = None
