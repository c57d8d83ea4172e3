"""Ranks of a run launched by torchrun: the process groups, made in the main thread first.

torchrun (or `torch.distributed.run`) sets RANK, WORLD_SIZE and LOCAL_WORLD_SIZE and the
rendezvous; this module joins it and makes every process group the run's collectives use
before any lane thread starts (group creation is not thread-safe, and every rank must create
every group, in one order). Collectives on the CPU go through gloo, on the GPU through NCCL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.kinds import Lane

# How long a collective waits for the other ranks before it fails the run with their names:
# long enough for a checkpoint write or a slow first compile on one rank, short enough that a
# dead rank does not leave the others hanging.
DEFAULT_TIMEOUT_S = 600
COLLECTIVE_LANES = (Lane.GATHER, Lane.REDUCE)


def launched_ranks(environ: Mapping[str, str] = os.environ) -> tuple[int, int, int] | None:
    """(rank, gpus per host, hosts) as torchrun set them, or None outside torchrun."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        per_host = int(environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_WORLD_SIZE must be whole numbers, as "
                         "torchrun sets them; launch with torchrun --nproc-per-node N -m "
                         "layerslide train ...") from None
    if per_host < 1 or world % per_host:
        raise ValueError(f"WORLD_SIZE={world} is not a whole number of hosts of "
                         f"LOCAL_WORLD_SIZE={per_host} ranks: give every host the same "
                         "--nproc-per-node")
    return rank, per_host, world // per_host


def backend(device_type: str) -> str:
    """gloo for CPU tensors (and the CPU's totals), NCCL for CUDA ones."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def join(device_type: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
         environ: Mapping[str, str] = os.environ) -> Ranks:
    """Join the run torchrun launched and make its process groups (SINGLE outside torchrun)."""
    import torch.distributed as dist

    found = launched_ranks(environ)
    if found is None:
        return SINGLE
    rank, gpus, hosts = found
    if not dist.is_initialized():
        dist.init_process_group(backend(device_type), timeout=timedelta(seconds=timeout_s))
    return Ranks(rank=rank, gpus=gpus, hosts=hosts, groups=_groups(dist, gpus, hosts, rank))


def _groups(dist, gpus: int, hosts: int, rank: int) -> dict:
    """Every group, made by every rank in the same order; each rank keeps those it is in."""
    mine: dict = {(None, "world"): dist.group.WORLD}
    spans = {"host": [list(range(h * gpus, (h + 1) * gpus)) for h in range(hosts)],
             "peers": [list(range(g, gpus * hosts, gpus)) for g in range(gpus)]}
    for lane in COLLECTIVE_LANES:
        for name, members in spans.items():
            for ranks in members:
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine[(lane, name)] = group
    return mine


def leave() -> None:
    """Tear the process groups down (each rank, at the run's end)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
