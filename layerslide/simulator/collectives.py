"""Ring collectives as the simulator prices them: how many ranks a task's group spans, and how
many bytes each rank sends (and receives) in how many steps.

With N ranks in a ring, an all-gather or a reduce-scatter of a buffer of B bytes sends
(N-1)/N B from every rank in N-1 steps; an all-reduce is both, 2(N-1)/N B in 2(N-1) steps
(NCCL's bus bandwidth is measured on the same count). A task's bytes are the whole buffer: the
gathered block, the block's grads before the scatter, or what is all-reduced.
"""

from __future__ import annotations

from layerslide.kinds import TaskKind

# kinds that are an all-reduce (the rest of the collectives are one all-gather or one
# reduce-scatter)
ALL_REDUCE_KINDS = (TaskKind.ALL_REDUCE_GRADS, TaskKind.REDUCE_NORM)


def group_ranks(comm_group: str, gpus: int, hosts: int) -> int:
    """How many ranks a collective of this group spans: a host's ranks, one rank per host
    (the same local rank on each), or every rank."""
    ranks = {"host": gpus, "peers": hosts, "world": gpus * hosts}
    if comm_group not in ranks:
        raise ValueError(f"collective group {comm_group!r} is not one of {', '.join(ranks)}")
    return ranks[comm_group]


def ring_traffic(kind: str, nbytes: float, ranks: int) -> tuple[float, int]:
    """(bytes each rank sends, the ring's steps) of a collective of `nbytes` over `ranks`
    ranks; (0, 0) for a group of one."""
    if ranks <= 1:
        return 0.0, 0
    rounds = 2 if kind in ALL_REDUCE_KINDS else 1
    return rounds * (ranks - 1) / ranks * nbytes, rounds * (ranks - 1)
