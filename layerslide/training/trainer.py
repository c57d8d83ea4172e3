"""Trainer: fine-tune a Hugging Face causal LM by running a plan's tasks, segment by segment.

The Trainer runs the plan it is given, the one that was simulated: its placement says what to
allocate, and a segment of `segment_steps` consecutive steps is that plan unrolled
(Plan.unroll: its first steps, its last step repeated). Inside a segment one step's optimizer
tail overlaps the next step's forward; between segments the pipeline drains (where logs and
checkpoints of the full training state are taken: segments end on checkpoint steps). Steps are
timed like the simulator times them: from one step's last GPU task to the next one's.

Several ranks (`ranks`, from training/distributed.join) each run the same plan on their own
micro-batches of one global order, each holding its slice of the host state; the logged loss,
grad norm and tokens/s are the global ones, and only rank 0 writes a saved model.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

from layerslide.data.sources import TokenSource
from layerslide.executor.blocks import ModelBlocks, check_supported
from layerslide.executor.device import LaneDevice
from layerslide.executor.engine import PlanEngine, TaskTiming
from layerslide.executor.grad_tasks import StepOutcome
from layerslide.executor.host_state import HostState
from layerslide.executor.memory import MemorySampler, return_freed_heap
from layerslide.executor.optim import OptimConfig
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.executor.runner import TaskRunner
from layerslide.planner.model import ModelSpec
from layerslide.planner.plan import Plan
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.trace import MemorySample, Trace, TraceEvent
from layerslide.training import hf_io
from layerslide.training.checkpoint_store import CheckpointInfo
from layerslide.training.evaluation import EvalResult, evaluate
from layerslide.training.step_watch import StepWatch
from layerslide.training.train_state import Checkpointing, CheckpointSchedule


@dataclass(frozen=True, kw_only=True)
class EvalSchedule:
    """When fit() scores the held-out `batches` (each as TokenSource.next_batch gives it):
    every `every_steps` steps (where segments then end) and after the last step."""

    batches: list[tuple[torch.Tensor, ...]]
    every_steps: int | None = None

    def __post_init__(self) -> None:
        if not self.batches:
            raise ValueError("an eval needs at least one batch")
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"eval every_steps={self.every_steps}: must be >= 1")


@dataclass(frozen=True, kw_only=True)
class StepLog:
    """One optimizer step as measured."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    skipped: bool
    skipped_blocks: tuple[int, ...]
    step_s: float
    tokens_per_s: float
    model_tflops: float  # model FLOPs (no recompute) per second, in TFLOP/s
    gpu_peak_bytes: int  # the peak since its segment began, as of its log (host_rss_bytes too)
    host_rss_bytes: int


def check_ranks(plan: Plan, ranks: Ranks) -> None:
    """Refuse, before anything is allocated, a plan made for another number of ranks."""
    placed = plan.placement
    if (placed.gpus, placed.hosts) != (ranks.gpus, ranks.hosts):
        raise ValueError(f"the plan is for {placed.gpus} GPU(s) per host on {placed.hosts} "
                         f"host(s), this run has {ranks.gpus} rank(s) per host on "
                         f"{ranks.hosts} host(s): plan with --gpus {ranks.gpus} --hosts "
                         f"{ranks.hosts}, or launch as many ranks as the plan has")


def check_executable(spec: ModelSpec, policy: Policy, blocks: ModelBlocks) -> None:
    """Refuse, before anything is allocated, what this executor does not run yet."""
    on_nvme = policy.residency.moments_on_nvme or policy.residency.master_on_nvme
    if on_nvme and policy.kernels.cpu_optimizer != "native":
        raise ValueError("optimizer state on NVMe needs cpu_optimizer='native' (torch's AdamW "
                         "keeps whole moments in RAM)")
    for b in blocks.blocks:
        if blocks.numel(b) != spec.block_params(b):
            raise ValueError(f"the plan is for {spec.name}, whose block {b} has "
                             f"{spec.block_params(b)} parameters; this model's has "
                             f"{blocks.numel(b)}: plan for this model (`layerslide plan/tune "
                             "--model <its folder>`)")


class Trainer:
    """Owns the device lanes, host state and GPU units of one training run; close() frees them.

    nvme_dir: the folder for state the policy keeps on NVMe; nvme_checkpoint_copies: how many
    checkpoints will be kept on that filesystem (each ends up owning a copy of the state files
    it hard-linked), counted when the folder's room is checked. ranks: this process's place
    among the run's ranks and their process groups (one process: SINGLE); nvme_dir is then this
    rank's own folder."""

    def __init__(self, *, config: PretrainedConfig, plan: Plan, optim: OptimConfig,
                 device: str | torch.device = "cuda", serial: bool = False,
                 segment_steps: int = 16, gpu_memory_bytes: int | None = None,
                 keep_trace: bool | int = True, nvme_dir: str | Path | None = None,
                 nvme_checkpoint_copies: int = 0, ranks: Ranks = SINGLE):
        spec, train, policy = plan.model, plan.train, plan.policy
        check_ranks(plan, ranks)
        self.ranks = ranks
        check_supported(config, train.seq_len)
        self.blocks = ModelBlocks(config)
        check_executable(spec, policy, self.blocks)
        if segment_steps < 1:
            raise ValueError(f"segment_steps={segment_steps}: must be >= 1")
        plan.unroll(min(segment_steps, plan.num_steps + 1))  # can it repeat? (raises if not)
        self.plan = plan
        self.optim = optim
        self.serial, self.segment_steps = serial, segment_steps
        self.device = LaneDevice(device)
        if gpu_memory_bytes is not None and self.device.is_cuda:
            total = torch.cuda.get_device_properties(self.device.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_memory_bytes / total),
                                                       self.device.device)
        try:
            self.state = HostState(self.blocks, self.device, policy, train, optim,
                                   plan.placement, nvme_dir=nvme_dir,
                                   nvme_checkpoint_copies=nvme_checkpoint_copies, ranks=ranks)
            self.runner = TaskRunner(self.blocks, spec, plan.placement, self.state, self.device,
                                     optim)
        except BaseException:
            self.device.close()  # unpin what was pinned before the failure
            raise
        self.step = 0  # optimizer steps taken (or skipped) so far
        self.failed = False  # training or a save raised: close() keeps the NVMe files
        self.stopped = False  # fit() ended early on its stop event
        self.checkpointing = Checkpointing(self)  # the full state's saves and restores
        # the measured trace grows by every task of every step: a long run that does not ask for
        # it (keep_trace=False) keeps none, or the segments that start within keep_trace=N steps
        if not isinstance(keep_trace, bool) and (not isinstance(keep_trace, int)
                                                 or keep_trace < 0):
            raise ValueError(f"keep_trace={keep_trace!r}: True, False or a number of steps >= 0")
        # the trace keeps the segments that start before step trace_steps (None: every step)
        self.trace_steps = None if keep_trace is True else int(keep_trace)
        self.trace_events: list[TraceEvent] = []
        self.memory: list[MemorySample] = []
        self._clock_s = 0.0  # trace time of the end of the last segment

    def allocated_bytes(self) -> dict[str, int]:
        """What this run holds, by the ids of the plan's static buffers
        (Plan.static_buffer_bytes: the two agree)."""
        return {**self.state.allocated_bytes(), **self.runner.allocated_bytes()}

    @property
    def spec(self) -> ModelSpec:
        return self.plan.model

    @property
    def train(self) -> TrainSpec:
        return self.plan.train

    @property
    def policy(self) -> Policy:
        return self.plan.policy

    # --- weights ---------------------------------------------------------------------------------
    def init_random(self, seed: int = 0) -> None:
        """Random weights (blocks.init_block). torch draws normals with an explicit generator on
        one thread (~0.2-0.3 G/s), so blocks kept wholly in RAM are drawn in place on a thread
        each; those with master weights on NVMe go through set_master one at a time. With
        several ranks on a host each draws every block whole (a generator's draws cannot skip
        ahead) and keeps its slice, on its share of the cores: the values one rank would have."""
        in_ram = [b for b in self.blocks.blocks if not self.state.disk_master.get(b, 0)]
        sliced = self.plan.placement.gpus > 1

        def draw(b: int) -> None:
            if sliced:
                self.state.set_master(b, self.blocks.init_block(b, seed))
            else:
                self.blocks.init_block(b, seed, out=self.state.master[b])

        workers = max(1, (os.cpu_count() or 1) // self.plan.placement.gpus)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(draw, in_ram))  # list(): a failed draw raises here
        for b in self.blocks.blocks:
            if b not in in_ram:
                self.state.set_master(b, self.blocks.init_block(b, seed))
        self.weights_changed()

    def load_checkpoint(self, folder: str | Path) -> None:
        """Read an HF folder's safetensors tensor by tensor into the fp32 master weights."""
        ignore = ("rotary_emb.inv_freq",) + (("lm_head.weight",) if self.blocks.tied else ())
        hf_io.check_checkpoint(folder, self.blocks.expected_tensors(), ignore=ignore)
        placed = self.state.load_named(
            hf_io.finite_tensors(hf_io.iter_checkpoint_tensors(folder), folder))
        missing = set(self.blocks.expected_tensors()) - placed
        if missing:
            raise ValueError(f"{folder}: no weights for {sorted(missing)[:3]}")
        self.weights_changed()

    def weights_changed(self) -> None:
        if self.plan.placement.load_source == "upload":  # the first loads read the bf16 copies
            for b in self.state.upload:
                self.state.cast_to_upload(b)
        self.runner.load_gpu_state()

    def save(self, folder: str | Path, *, overwrite: bool = False,
             extra_files: dict[str, Path] | None = None) -> Path | None:
        """Write the model as an HF folder (bf16 safetensors) that from_pretrained loads. With
        several ranks every rank calls it (each block's weights are gathered from the host's
        slices) and rank 0 alone writes the folder: the others return None."""
        self.runner.store_gpu_state()
        self.device.synchronize()
        if not self.ranks.is_first:
            for _ in self.state.named_master():  # take part in each block's gather
                pass
            return None
        config = self.blocks.config.to_dict()
        config.pop("_attn_implementation_autoset", None)
        tensors = self.state.named_master()
        try:
            return hf_io.save_hf_folder(folder, config, tensors, overwrite=overwrite,
                                        extra_files=extra_files)
        except BaseException:
            if self.plan.placement.gpus > 1:  # the other ranks' gathers go on to their end
                with suppress(Exception):
                    for _ in tensors:
                        pass
            raise

    # --- training --------------------------------------------------------------------------------
    def fit(self, data: TokenSource, num_steps: int,
            on_step: Callable[[StepLog], None] | None = None,
            on_step_done: Callable[[int], None] | None = None,
            checkpoints: CheckpointSchedule | None = None,
            on_checkpoint: Callable[[CheckpointInfo, float], None] | None = None,
            stop: threading.Event | None = None,
            evals: EvalSchedule | None = None,
            on_eval: Callable[[EvalResult], None] | None = None,
            save_every: int | None = None,
            on_save: Callable[[int], None] | None = None,
            ) -> list[StepLog]:
        """Train `num_steps` optimizer steps; returns one log per step. `on_step_done(step)`
        comes as soon as a step's tasks have run on the host (from a lane's thread), and
        `on_step(log)` once its GPU work has too (from a thread of its own, in step order). With
        `checkpoints`, segments end on checkpoint steps and the state is saved there;
        `on_checkpoint(info, seconds)` follows each save (seconds: the pipeline's stall).
        Once `stop` is set (e.g. by a signal handler) training ends after the step in flight,
        the state is saved if `checkpoints` is given, and `stopped` is True. With `evals`, the
        held-out batches are scored on their schedule and `on_eval(result)` gets each score.
        With `save_every`, `on_save(step)` is called every that many steps but the last, where
        the pipeline is drained and the host's master weights are whole (to save the model)."""
        if save_every is not None and save_every < 1:
            raise ValueError(f"save_every={save_every}: must be >= 1")
        saves = self.checkpointing
        if (checkpoints is not None and checkpoints.background and not saves.copies_kept
                and saves.writes(checkpoints.store)):
            saves.keep_checkpoint_copies()  # copies into fresh memory fault: a longer stall
        saves.restart_clock()
        logs: list[StepLog] = []
        self.stopped = False
        # several ranks stop together where a segment ends: the engine never cuts theirs, whose
        # cuts could fall on other steps and leave a rank's collectives waiting for the others
        cut = stop if self.ranks.world == 1 else None
        while len(logs) < num_steps and not self.stopped:
            if self._stop_asked(stop):  # between segments: nothing in flight
                self.stopped = True
                break
            count = self._segment_length(num_steps - len(logs), checkpoints, evals, save_every)
            before = self.step
            with self._failing():  # close() keeps the NVMe files as the last good step left them
                segment, log_error = self._segment(data, count, on_step, on_step_done, cut)
            if log_error is not None:  # the steps ran and are counted: only their logs failed
                raise log_error
            logs.extend(segment)
            self.stopped = self.step - before < count
            finished = len(logs) == num_steps
            if not self.stopped:
                self._score_and_save(evals, on_eval, save_every if not finished else None,
                                     on_save, finished=finished)
                self.stopped = cut is None and not finished and self._stop_asked(stop)
            if checkpoints is not None:
                with self._failing():  # keep the NVMe files: the checkpoint may be incomplete
                    saves.at_segment_end(checkpoints, data, last=self.stopped or finished,
                                         on_checkpoint=on_checkpoint)
        with self._failing():
            saves.report_written(on_checkpoint)
        self.runner.store_gpu_state()  # the host's master weights are whole again
        self.device.synchronize()
        return logs

    def _stop_asked(self, stop: threading.Event | None) -> bool:
        """Whether `stop` is set; with several ranks, on any of them (a collective: every
        rank passes a stop event to fit(), or none does)."""
        asked = stop is not None and stop.is_set()
        if self.ranks.world == 1 or stop is None:
            return asked
        flag = torch.tensor([int(asked)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.ranks.group(None, "world"))
        return bool(flag[0])

    def _segment_length(self, steps_left: int, *schedules) -> int:
        """The next segment's steps: at most segment_steps, ending where a checkpoint, an eval
        or a save is due (schedules: those, or their every_steps, each None where not asked)."""
        count = min(self.segment_steps, steps_left)
        for schedule in schedules:
            every = getattr(schedule, "every_steps", schedule)
            if every is not None:
                count = min(count, every - self.step % every)
        return count

    def _score_and_save(self, evals, on_eval, save_every, on_save, *, finished: bool) -> None:
        """At a segment's end: the eval score where it is due (and after the last step), the
        model's save where it is due (never after the last: the caller saves that one)."""
        if evals is not None and (finished or (evals.every_steps is not None
                                               and self.step % evals.every_steps == 0)):
            result = self.evaluate(evals.batches)
            if on_eval is not None:
                on_eval(result)
        if save_every is not None and on_save is not None and self.step % save_every == 0:
            self.runner.store_gpu_state()
            self.device.synchronize()
            on_save(self.step)

    @contextmanager
    def _failing(self):
        """Marks the run failed if the body raises: close() then keeps the NVMe files."""
        try:
            yield
        except BaseException:
            self.failed = True
            raise

    def evaluate(self, batches: list[tuple[torch.Tensor, ...]]) -> EvalResult:
        """The loss and next-token accuracy of the current weights on `batches` (a forward
        pass; call where the pipeline is drained, as fit() does)."""
        return evaluate(self.runner, self.state, batches, self.step)

    def _segment(self, data: TokenSource, count: int,
                 on_step: Callable[[StepLog], None] | None,
                 on_step_done: Callable[[int], None] | None,
                 stop: threading.Event | None = None,
                 ) -> tuple[list[StepLog], BaseException | None]:
        """Run `count` steps (fewer where `stop` cut the segment: the data then resumes after
        the last step run), each logged as soon as it has run (StepWatch); returns their logs
        and a failure of on_step (or of making a log), for the caller to raise."""
        plan = self.plan.unroll(count)
        positions, batches = [], {}
        for s in range(count):
            positions.append(data.state_dict())
            batches.update(self._step_batches(data, s))
        self.runner.prepare(plan, batches, self.step)
        if self.device.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device.device)
        self.device.reset_clock()
        sampler = MemorySampler(self.device)
        offset = self.step

        def done(s: int) -> None:
            watch.step_done(s)
            if on_step_done is not None:
                on_step_done(offset + s)

        engine = PlanEngine(plan, self.device, self.runner.run, serial=self.serial,
                            on_step_done=done, stop=stop)
        watch = StepWatch(self._log_maker(plan, engine, sampler), on_step)
        watch.start(engine, self.device.bind_thread)
        try:
            timings = engine.run()
        except BaseException:
            watch.abandon()
            raise
        finally:
            sampler.stop()
        logs = watch.finish()
        if engine.stopped_after is not None:
            count = engine.stopped_after + 1
            data.load_state_dict(positions[count])
        self._keep_trace(timings, sampler)
        self.step += count
        return_freed_heap()
        return logs, watch.error

    def _step_batches(self, data: TokenSource, s: int) -> dict[tuple[int, int], tuple]:
        """Step s's micro-batches of this rank: of the step's grad_accum x ranks micro-batches
        in the data's order, rank r's are the r-th grad_accum of them. Every rank reads them
        all, so the data's position is the same on every rank (and a run resumes on any count
        of ranks that divides the global batch)."""
        accum, mine = self.train.grad_accum, {}
        for i in range(accum * self.ranks.world):
            batch = data.next_batch(self.train.micro_batch)
            if i // accum == self.ranks.rank:
                mine[(s, i % accum)] = batch
        return mine

    def _log_maker(self, plan: Plan, engine: PlanEngine,
                   sampler: MemorySampler) -> Callable[[int], StepLog]:
        """The log of the segment's step s, once it has landed; called in step order. A step
        is timed from the previous step's last GPU task to its own, as the simulator times it."""
        markers, offset, ends = plan.meta["step_markers"], self.step, [0.0]
        flops_per_token = self.spec.training_flops_per_token(self.train.seq_len)
        tokens = self.train.global_tokens_per_step  # every rank's: one step learns from them

        def make(s: int) -> StepLog:
            ends.append(engine.end_s(markers[s]))
            step_s = max(ends[-1] - ends[-2], 1e-9)
            outcome = self.runner.step_outcome(s)
            return StepLog(
                step=offset + s, loss=self._global_loss(outcome), lr=self.optim.lr_at(offset + s),
                grad_norm=outcome.grad_norm, skipped=outcome.skipped,
                skipped_blocks=tuple(outcome.skipped_blocks), step_s=step_s,
                tokens_per_s=tokens / step_s,
                model_tflops=flops_per_token * tokens / step_s / 1e12,
                gpu_peak_bytes=(torch.cuda.max_memory_allocated(self.device.device)
                                if self.device.is_cuda else 0),
                host_rss_bytes=sampler.peak_host_bytes)
        return make

    def _global_loss(self, outcome: StepOutcome) -> float:
        """A step's loss over every rank's micro-batches (each rank's part is already scaled
        by its share of the step's), summed on a group of the step logs' own."""
        local = float(sum(float(p) for p in outcome.loss_parts))
        if self.ranks.world == 1:
            return local
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total, group=self.ranks.group(None, "step_logs"))
        return float(total[0])

    def _keep_trace(self, timings: list[TaskTiming], sampler: MemorySampler) -> None:
        """The segment's task timings and memory samples, while the trace keeps steps."""
        if self.trace_steps is None or self.step < self.trace_steps:
            self.trace_events.extend(TraceEvent(
                task_id=t.task.id, lane=t.task.lane, kind=t.task.kind, block=t.task.block,
                step=self.step + t.task.step, start_s=t.start_s, end_s=t.end_s,
                dispatch_start_s=t.dispatch[0] if t.dispatch else None,
                dispatch_end_s=t.dispatch[1] if t.dispatch else None).shifted(self._clock_s)
                for t in timings)
            self.memory.extend(MemorySample(time_s=self._clock_s + m.time_s, tier=m.tier,
                                            bytes_in_use=m.bytes_in_use) for m in sampler.samples)
        self._clock_s += max((t.end_s for t in timings), default=0.0)

    def trace(self, label: str = "executor") -> Trace:
        """Everything run so far, in the simulator's trace schema."""
        return Trace(source="measured", label=label, events=tuple(self.trace_events),
                     memory=tuple(self.memory),
                     meta={"model": self.spec.name, "train": self.train.to_dict(),
                           "policy": self.policy.to_dict(), "device": str(self.device.device),
                           "serial": self.serial})

    def close(self) -> None:
        """Unpin host memory and delete the NVMe tier's files, state and activation checkpoints:
        scratch once the run is over, and what a checkpoint hard-linked stays. A run that failed
        keeps them, as they were at its last good step."""
        if self.checkpointing.in_flight:  # a checkpoint of a step before a failure is good
            try:
                self.checkpointing.wait_for_checkpoint()
            except Exception as err:  # noqa: BLE001 (the failure that ended the run comes first)
                warnings.warn(f"the checkpoint being written failed too: {err}", RuntimeWarning,
                              stacklevel=2)
        self.checkpointing.drop_checkpoint_copies()
        self.device.close()
        if not self.failed:
            if self.state.nvme is not None:
                self.state.nvme.remove_files()
            if self.runner.activation_files is not None:
                self.runner.activation_files.remove_files()
        if self.state.nvme_locks is not None:
            self.state.nvme_locks.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.failed = self.failed or exc_type is not None
        self.close()
