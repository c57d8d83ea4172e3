"""AdamW hyper-parameters and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW (decoupled weight decay on matrices only) with linear warmup then cosine decay."""

    lr: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    # cosine decay from lr to lr * min_lr_ratio over the steps after warmup; None: no decay
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"OptimConfig.lr={self.lr}: must be > 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimConfig.{name}={getattr(self, name)}: must be in [0, 1)")
        if not self.eps > 0 or self.weight_decay < 0:
            raise ValueError("OptimConfig: eps must be > 0 and weight_decay >= 0")
        if self.warmup_steps < 0 or (self.decay_steps is not None and self.decay_steps < 1):
            raise ValueError("OptimConfig: warmup_steps must be >= 0 and decay_steps >= 1 or None")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"OptimConfig.min_lr_ratio={self.min_lr_ratio}: must be in [0, 1]")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps is None:
            return self.lr
        progress = min(1.0, (step - self.warmup_steps) / self.decay_steps)
        low = self.lr * self.min_lr_ratio
        return low + (self.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def to_dict(self) -> dict:
        return asdict(self)
