"""The tasks around a block's update, part of the TaskRunner (a mixin: it reads the runner's
grads, outcomes and host state): its grads offloaded and summed on the host, the step's
gradient norm and clipping, the optimizer step, and the NVMe tier's reads and writes of the
state around it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from layerslide.planner.plan import Task


@dataclass
class StepOutcome:
    """What one training step produced: its loss (the head's parts), its grad norm and skips."""

    loss_parts: list[torch.Tensor] = field(default_factory=list)
    grad_norm: float | None = None
    skipped: bool = False  # non-finite gradients: no block was updated
    skipped_blocks: list[int] = field(default_factory=list)  # non-finite without clipping


class GradTasks:
    """Grad, norm, optimizer and NVMe-state task kinds of a TaskRunner."""

    def _grads_key(self, task: Task) -> tuple[int, int, int]:
        """(step, micro-batch, block) of the grads a task takes: a micro-batch's, or (summed on
        the GPU) the step's, kept by its last one."""
        m = self.train.grad_accum - 1 if self.sums_on_gpu else task.micro_batch
        return task.step, m, task.block

    def _do_offload_grads(self, task: Task) -> None:
        s, m, b = key = self._grads_key(task)
        landing = self._landed(task)
        if key in self.reduced:  # several ranks: this rank's slice of their sum
            owned = self.reduced.pop(key)
            self.device.keep_for(owned, "d2h")
            sq = self.reduced_sq.pop(key, None)
            if sq is None:  # one rank a host: the block's own sum, whole
                sq = torch.linalg.vector_norm(owned, dtype=torch.float32).square()
            self.device.keep_for(sq, "d2h")
            landing.copy_(owned, non_blocking=True)
            self.grad_sq[s][m, b + 1].copy_(sq, non_blocking=True)
            return
        *grads, sq = self.grads.pop(key)
        for (_, view), grad in zip(self.blocks.views(b, landing), grads, strict=True):
            self.device.keep_for(grad, "d2h")
            view.copy_(grad, non_blocking=True)
        self.device.keep_for(sq, "d2h")
        self.grad_sq[s][m, b + 1].copy_(sq, non_blocking=True)

    def _landed(self, task: Task) -> torch.Tensor:
        """The host buffer the task's block's grads land in (the task's slot of the pool)."""
        return self.state.landing_buffer(task.block, task.slot)

    def _do_accumulate_grads(self, task: Task) -> None:
        s, m, b = task.step, task.micro_batch, task.block
        self.state.accumulate(b, m, self._landed(task))
        if m == self.train.grad_accum - 1 and self.train.max_grad_norm is not None:
            self.block_sq[(s, b)] = self.state.host_grad_sq_norm(b)

    def _block_sq(self, s: int, b: int) -> float:
        if b in self.gpu_blocks:
            return float(self.final_sq[s][b + 1])
        if self.state.sums_on_host:
            return self.block_sq[(s, b)]
        # offloaded once per step, by its last micro-batch (the only one without accumulation)
        return float(self.grad_sq[s][self.train.grad_accum - 1, b + 1])

    def _do_grad_norm(self, task: Task) -> None:
        s = task.step
        squares = sum(self._block_sq(s, b) for b in self.blocks.blocks)
        if self.sharded:  # this rank's slices: reduce_norm sums the host's
            self.partial_sq[s] = squares
            return
        self._clip(s, squares)

    def _clip(self, s: int, squares: float) -> None:
        """The step's grad norm from its squares, its clipping coefficient, or its skip."""
        total = math.sqrt(squares)
        outcome = self.outcomes[s]
        outcome.grad_norm = total
        if not math.isfinite(total):
            outcome.skipped = True
            return
        self.clip_coef[s] = min(1.0, self.train.max_grad_norm / (total + 1e-6))

    def _do_optimizer_step(self, task: Task) -> None:
        s, b = task.step, task.block
        outcome = self.outcomes[s]
        if outcome.skipped:
            self.state.restore_upload(b)  # the grads that landed there are not weights
            return
        lr, coef = self.optim.lr_at(self.step_offset + s), self.clip_coef.get(s, 1.0)
        if b in self.gpu_blocks:  # on the GPU lane: non-finite grads are skipped there
            self.gpu_blocks.step(b, s, lr, coef)
            self.gpu_blocks.refresh(b, self.dedicated[b].flat)
            return
        if not bool(torch.isfinite(self.grad_sq[s][:, b + 1]).all()):
            outcome.skipped_blocks.append(b)  # without clipping there is no step-wide check
            self.state.restore_upload(b)
            return
        landed = None if self.state.sums_on_host else self._landed(task)
        self.state.step(b, lr, coef, landed)

    def step_outcome(self, s: int) -> StepOutcome:
        """Step s's outcome, once its GPU work is done: GPU-updated blocks whose update the
        GPU skipped are recorded then (their flags are read once)."""
        outcome = self.outcomes[s]
        for b in self.gpu_updated:
            found_inf = self.gpu_blocks.found_inf.pop((s, b), None)
            if found_inf is not None and float(found_inf) and not outcome.skipped:
                outcome.skipped_blocks.append(b)
        return outcome

    def _do_read_state(self, task: Task) -> None:
        self.state.nvme.read(task.block, task.slot)

    def _do_write_state(self, task: Task) -> None:
        self.state.nvme.write(task.block, task.slot)

    def _do_read_weights(self, task: Task) -> None:
        self.state.nvme.read_weights(task.block, task.slot)
