"""The GPU buffer a block's bf16 weights are loaded into, shared by the runner's loads and the
collectives that fill it on several ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class WeightUnit:
    """A GPU buffer for one block's bf16 weights (and the module computing from it). With
    several ranks on a host `flat` is the front of `padded`, every rank's slice back to back
    (planner/sharding.py): what the loads and the all-gather fill."""

    flat: torch.Tensor
    module: nn.Module | None = None
    landing_fp32: torch.Tensor | None = None  # cast=gpu: fp32 weights arrive here first, padded
    padded: torch.Tensor | None = None  # None: no padding, flat itself

    @property
    def arrivals(self) -> torch.Tensor:
        """Where loads send a block's slices: the fp32 landing where there is one, else the
        bf16 buffer, padded."""
        if self.landing_fp32 is not None:
            return self.landing_fp32
        return self.flat if self.padded is None else self.padded
