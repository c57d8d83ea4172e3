"""This process's place among a run's ranks, and the process groups its collectives use.

Made once in the main thread before any lane starts (`layerslide.training.distributed`), then
handed to the Trainer and the TaskRunner. Each collective lane has process groups of its own
(`Lane.GATHER`, `Lane.REDUCE`), so the two lanes' collectives never wait on each other's order;
every rank issues a lane's collectives in the plan's lane order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerslide.kinds import Lane


@dataclass(frozen=True, kw_only=True)
class Ranks:
    """rank of gpus x hosts ranks; local_rank is its place on its host (the slice it owns)."""

    rank: int = 0
    gpus: int = 1  # ranks per host
    hosts: int = 1
    # (lane, comm group) -> the torch.distributed process group a collective of that lane and
    # Task.comm_group runs on; "world" (lane None) is the main thread's, for the step's totals,
    # and "step_logs" (lane None) the thread's that logs each step as it lands
    groups: dict[tuple[str | None, str], object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.hosts < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"Ranks(rank={self.rank}, gpus={self.gpus}, hosts={self.hosts}): "
                             f"rank must be in 0..{self.world - 1}")

    @property
    def world(self) -> int:
        return self.gpus * self.hosts

    @property
    def local_rank(self) -> int:
        return self.rank % self.gpus

    @property
    def host(self) -> int:
        return self.rank // self.gpus

    @property
    def is_first(self) -> bool:
        """The rank that writes logs, saves and the output folder."""
        return self.rank == 0

    def group(self, lane: Lane | None, comm_group: str) -> object:
        """The process group of a collective on `lane` spanning `comm_group`."""
        try:
            return self.groups[(lane, comm_group)]
        except KeyError:
            raise ValueError(f"rank {self.rank}: no process group for {comm_group!r} "
                             f"collectives on lane {lane}; the run's ranks were set up for "
                             f"{sorted(self.groups)}") from None


SINGLE = Ranks()  # one process: no collectives
