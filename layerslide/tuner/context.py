"""What every candidate of one tune shares, set once in each worker process."""

from __future__ import annotations

from dataclasses import dataclass

from layerslide.hwprofiles import HardwareProfile
from layerslide.planner import ModelSpec, Policy, TrainSpec
from layerslide.tuner.space import SearchSpace


@dataclass(frozen=True, kw_only=True)
class TuneContext:
    """One tune's model, profile, space, GPU cap, plan length and ranks (GPUs per host, hosts:
    every candidate's TrainSpec has them)."""

    model: ModelSpec
    profile: HardwareProfile
    space: SearchSpace
    gpu_memory_bytes: int | None
    num_steps: int
    gpus: int = 1
    hosts: int = 1

    @property
    def settle_late(self) -> bool:
        """The profile has a busy speedup: the sweep holds the clock, the leaders settle it."""
        return self.profile.gpu.busy_speedup is not None

    @property
    def fills_gpu_updates(self) -> bool:
        """The leaders get the GPU-update fill: where the space asks, with one rank (the
        planner refuses blocks updated on the GPU with several)."""
        return self.space.fill_gpu_updates and self.gpus * self.hosts == 1

    def sweep_options(self) -> dict:
        """stages.evaluate's options in the sweep: the GPU-update fill (several simulations
        each) only for the leaders, after it."""
        return {"gpu_memory_bytes": self.gpu_memory_bytes, "allow_nvme": self.space.allow_nvme,
                "num_steps": self.num_steps, "fill_gpu_updates": False,
                "settle_clock": not self.settle_late}


def without_micro_batch(train: TrainSpec, policy: Policy) -> tuple:
    """A candidate's settings but its micro-batch: those that overflowed the GPU at one
    micro-batch are not tried at a larger one (GPU memory grows with the micro-batch)."""
    return train.seq_len, train.grad_accum, train.max_grad_norm, policy
