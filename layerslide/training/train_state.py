"""The full training state of a Trainer's run, as checkpoints hold it: fp32 master weights and
AdamW moments by block, step counts and the data position, written by `CheckpointStore` (at a
drained pipeline, or beside training through a `SnapshotGuard`) and read back on resume.

A checkpoint holds each block's state whatever the schedule, so a resume checks only what the
state means and how it is laid out (model, optimizer settings, moment precision, the NVMe
fractions): a run may resume under another micro-batch, window, placement or kernel choice.

Several ranks: each rank of the first host writes its slices (training/rank_checkpoints.py),
and a resume on another count of ranks (one included) cuts its slices out of the saved ones.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from layerslide.data.sources import TokenSource
from layerslide.executor.moments import Moments
from layerslide.executor.nvme import state_file_stripes
from layerslide.planner.settings import STATE_LAYOUT_FIELDS, Policy, TrainSpec
from layerslide.training.checkpoint_snapshot import (
    RAM_RESERVE_BYTES,
    CheckpointSnapshot,
    SnapshotGuard,
    available_ram_bytes,
    keep_copy_buffers,
)
from layerslide.training.checkpoint_store import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointInfo,
    CheckpointStore,
)
from layerslide.training.rank_checkpoints import (
    SavedStep,
    layout_meta,
    rank_store,
    reslice,
    reslice_with_disk,
    saved_steps,
    slices_of,
)

STATE_FORMAT = "layerslide-train-state/1"


@dataclass(frozen=True, kw_only=True)
class CheckpointSchedule:
    """When fit() writes the full training state: every `every_steps` steps and/or once
    `every_minutes` have passed since the last one (checked where segments end), and at the end.
    `meta` is stored with it (the CLI keeps its arguments there to resume from). background:
    written while the next steps run (checkpoint_snapshot); else the pipeline waits for it."""

    store: CheckpointStore
    every_steps: int | None = None
    every_minutes: float | None = None
    meta: dict = field(default_factory=dict)
    background: bool = True

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"checkpoint every_steps={self.every_steps}: must be >= 1")
        if self.every_minutes is not None and not self.every_minutes > 0:
            raise ValueError(f"checkpoint every_minutes={self.every_minutes}: must be > 0")



class Checkpointing:
    """Saves and restores a Trainer's full state (`trainer.checkpointing`). A checkpoint
    written beside training is in flight until wait_for_checkpoint(); its copies of the state
    go into buffers kept from one checkpoint to the next."""

    def __init__(self, trainer):  # the Trainer whose state it is (its owner)
        self.trainer = trainer
        self._snapshot: CheckpointSnapshot | None = None  # a checkpoint being written
        self._copy_buffers: dict[str, dict[str, torch.Tensor]] = {}  # kept between checkpoints
        # at most this much RAM for checkpoint copies (None: what is free beyond the reserve)
        self.copy_ram_bytes: int | None = None
        self._last_save_s = time.monotonic()  # for a schedule's every_minutes
        self._rank_stores: dict[Path, CheckpointStore | None] = {}  # by the run's store's root
        self._pins: dict[str, Path] = {}  # NVMe files' links a checkpoint in flight reads

    @property
    def in_flight(self) -> bool:
        return self._snapshot is not None

    def done_in_background(self) -> bool:
        """A checkpoint written beside training has finished (wait_for_checkpoint reports it)."""
        return self._snapshot is not None and self._snapshot.done()

    @property
    def copies_kept(self) -> bool:
        return bool(self._copy_buffers)

    def restart_clock(self) -> None:
        """Count a schedule's every_minutes from now (fit() starts)."""
        self._last_save_s = time.monotonic()

    def at_segment_end(self, schedule: CheckpointSchedule, data: TokenSource, *, last: bool,
                       on_checkpoint) -> None:
        """Where fit()'s pipeline has drained: report a checkpoint written beside training,
        and write one where the schedule says (at the last step always, and there whole: nothing
        runs beside it). on_checkpoint(info, seconds the pipeline stalled for it)."""
        if self._writer(schedule.store) is None:  # another host's rank: the first host's state
            return
        step = self.trainer.step
        due = last or (schedule.every_steps is not None and step % schedule.every_steps == 0) or (
            schedule.every_minutes is not None
            and time.monotonic() - self._last_save_s >= 60 * schedule.every_minutes)
        if self.done_in_background():
            self.report_written(on_checkpoint)
        if not due:
            return
        start_s = time.monotonic()
        waited_s = self.report_written(on_checkpoint)
        if schedule.background and not last:
            snapshot = self.start_save_state(schedule.store, data, meta=schedule.meta)
            snapshot.waited_s = waited_s
        else:
            info = self.save_state(schedule.store, data, meta=schedule.meta)
            if on_checkpoint is not None:
                on_checkpoint(info, time.monotonic() - start_s)
        self._last_save_s = time.monotonic()

    def report_written(self, on_checkpoint) -> float:
        """Wait for a checkpoint being written beside training and report it with the time
        training stalled for it; returns the seconds this wait took."""
        start_s = time.monotonic()
        written = self.wait_for_checkpoint()
        waited_s = time.monotonic() - start_s
        if written is not None and on_checkpoint is not None:
            info, snapshot = written
            on_checkpoint(info, snapshot.stall_s + snapshot.waited_s + waited_s)
        return waited_s

    def _state_groups(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every tensor of the training state by block, on the host: fp32 master weights and
        AdamW moments (their tensors named as moments.Moments.layout names them). GPU-updated
        blocks get host staging buffers of their own (for the time of a save or restore).
        In the order the blocks' updates come in a step (head first): a checkpoint written
        beside training writes each before its next update wants it."""
        gpu, groups = self.trainer.runner.gpu_blocks, {}
        for b in reversed(self.trainer.blocks.blocks):
            if b in gpu:
                moments = Moments.zeros(self.trainer.state.moment_precision, self.trainer.blocks.numel(b))
                master = torch.empty_like(self.trainer.state.master[b])
            else:
                moments, master = self.trainer.state.moments[b], self.trainer.state.master[b]
            groups[f"block_{b}"] = {"master": master, **moments.tensors}
        return groups

    def _gpu_moments_staging(self, groups: dict, block: int) -> Moments:
        return Moments(self.trainer.state.moment_precision,
                       {name: groups[f"block_{block}"][name]
                        for name in self.trainer.runner.gpu_blocks.moments[block].tensors})

    def _identity(self) -> dict:  # what a checkpoint records of the run that wrote it
        return {"model": self.trainer.spec.to_dict(), "train": self.trainer.train.to_dict(),
                "policy": _what_it_computes(self.trainer.policy.to_dict()),
                "optim": self.trainer.optim.to_dict()}

    def writes(self, store: CheckpointStore) -> bool:
        """Whether this rank writes checkpoints of the run's `store` (not another host's)."""
        return self._writer(store) is not None

    def _writer(self, store: CheckpointStore) -> CheckpointStore | None:
        """The store this rank writes to for the run's `store` (None: it writes nothing)."""
        if store.root not in self._rank_stores:
            self._rank_stores[store.root] = rank_store(store, self.trainer.ranks)
        return self._rank_stores[store.root]

    def _check_resumable(self, path: Path, meta: dict) -> None:
        """The state is per block whatever the schedule (micro-batch, window, placement, ...):
        what it means, and where its parts lie, must match this run's."""
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"{path}: not a layerslide training state "
                             f"(format {meta.get('format')!r}, expected {STATE_FORMAT!r})")
        mine, theirs = _state_identity(self._identity()), _state_identity(meta)
        for key, value in mine.items():
            if theirs.get(key) != value:
                raise ValueError(f"{path} was written with other {key} settings "
                                 f"({theirs.get(key)}) than this run's ({value}): resume with "
                                 f"the {key} settings of the run that wrote it")

    def save_state(self, store: CheckpointStore, data: TokenSource, *,
                   meta: dict | None = None) -> CheckpointInfo | None:
        """Write the full training state (weights, moments, step counts, data position) as one
        checkpoint; call where the pipeline is drained (between fit() calls or segments). With
        several ranks each writes its slices (None on a rank of another host: it writes none)."""
        self.wait_for_checkpoint()
        store = self._writer(store)
        if store is None:
            return None
        step, groups, state_meta, links = self._checkpoint_parts(store, data, meta)
        return store.save(step, groups, state_meta, link_files=links)

    def start_save_state(self, store: CheckpointStore, data: TokenSource, *,
                         meta: dict | None = None) -> CheckpointSnapshot | None:
        """save_state's checkpoint, written while training goes on: call where the pipeline
        is drained; the next updates of each block wait for (or copy) its part, within the RAM
        the machine has free beyond RAM_RESERVE_BYTES. wait_for_checkpoint() gives its info."""
        self.wait_for_checkpoint()
        store = self._writer(store)
        if store is None:
            return None
        start_s = time.monotonic()
        step, groups, state_meta, links = self._checkpoint_parts(store, data, meta,
                                                                 pinned=True)
        cpu_groups = {b: f"block_{b}" for b in self.trainer.state.steps_taken}
        guard = SnapshotGuard(groups, cpu_groups, self._copy_budget_bytes(),
                              kept=self._copy_buffers)
        self.trainer.state.update_guard = guard
        self._snapshot = CheckpointSnapshot(store, step, groups, state_meta, link_files=links,
                                            guard=guard, stall_s=time.monotonic() - start_s)
        return self._snapshot

    def keep_checkpoint_copies(self) -> int:
        """Before the first checkpoint written beside training: make the RAM its copies of the
        state go into (within what the machine has free beyond RAM_RESERVE_BYTES, the blocks
        updated first first) and touch every page, so that its copies run at memory speed.
        fit() with background checkpoints calls this when none are kept; checkpoints keep
        them from one to the next anyway. Returns the bytes held."""
        self.wait_for_checkpoint()
        return keep_copy_buffers(self._host_updated_groups(), self._copy_budget_bytes(),
                                 self._copy_buffers)

    def _copy_budget_bytes(self) -> int:
        """RAM new checkpoint copies may take: what is free beyond the reserve (this rank's
        share of it, where a host runs several), within checkpoint_copy_ram_bytes less the
        copies kept already."""
        free = (available_ram_bytes() - RAM_RESERVE_BYTES) // self.trainer.ranks.gpus
        if self.copy_ram_bytes is None:
            return free
        return min(free, self.copy_ram_bytes - self.checkpoint_copy_bytes)

    def _host_updated_groups(self) -> dict[str, dict[str, torch.Tensor]]:
        """The state's groups a checkpoint beside training copies: the blocks the host
        updates, in update order."""
        return {f"block_{b}": {"master": self.trainer.state.master[b], **self.trainer.state.moments[b].tensors}
                for b in reversed(self.trainer.blocks.blocks) if b in self.trainer.state.steps_taken}

    @property
    def host_updated_state_bytes(self) -> int:
        """Bytes of the state a checkpoint beside training copies (all of it kept: no waits)."""
        return sum(t.nbytes for ts in self._host_updated_groups().values() for t in ts.values())

    @property
    def checkpoint_copy_bytes(self) -> int:
        """RAM held for checkpoint copies (outside the plan's buffers)."""
        # a list: a checkpoint's writer threads may add to the dict meanwhile
        return sum(t.nbytes for buffers in list(self._copy_buffers.values())
                   for t in buffers.values())

    def drop_checkpoint_copies(self) -> None:
        """Free the RAM kept for checkpoint copies (the next checkpoint beside training
        allocates afresh)."""
        self.wait_for_checkpoint()
        self._copy_buffers.clear()

    def wait_for_checkpoint(self) -> tuple[CheckpointInfo, CheckpointSnapshot] | None:
        """Wait for the checkpoint start_save_state began (None if none is in flight); raises
        what its write raised."""
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return None
        try:
            return snapshot.wait(), snapshot
        finally:
            self.trainer.state.update_guard = None
            for pin in self._pins.values():  # linked by the checkpoint, or it failed
                pin.unlink(missing_ok=True)
            self._pins = {}

    def _checkpoint_parts(self, store: CheckpointStore, data: TokenSource, meta: dict | None,
                          pinned: bool = False):
        """What CheckpointStore.save takes, for the state as it is now (pinned: its NVMe
        files' links made now, for a write beside training, which replaces the files)."""
        groups = self._state_groups()
        gpu = self.trainer.runner.gpu_blocks
        for b in gpu.ids:
            gpu.store(b, groups[f"block_{b}"]["master"])
            self._gpu_moments_staging(groups, b).copy_(gpu.moments[b])
        self.trainer.device.synchronize()
        steps_taken = {str(b): n for b, n in self.trainer.state.steps_taken.items()}
        steps_taken.update({str(b): int(gpu.steps[b]) for b in gpu.ids})
        state_meta = {"format": STATE_FORMAT, "step": self.trainer.step, "steps_taken": steps_taken,
                      "data": data.state_dict(), **self._identity(), "run": meta or {}}
        if self.trainer.ranks.world > 1:  # the slices this rank's groups hold
            state_meta["ranks"] = layout_meta(self.trainer.ranks, self.trainer.state.shards)
        # moments on NVMe: their files join the checkpoint as hard links (the tier replaces a
        # file by rename, never in place, so a linked checkpoint stays as it was)
        nvme = self.trainer.state.nvme
        links = {} if nvme is None else {path.name: path for b in nvme.disk_blocks
                                         for path in nvme.paths(b)}
        if pinned and links:
            links = self._pins = nvme.pin_files()
        store.check_space(groups, link_files=links)
        return self.trainer.step, groups, state_meta, links

    def restore_state(self, store: CheckpointStore, data: TokenSource, *,
                      fallback: bool = False) -> CheckpointInfo:
        """Continue from the newest good checkpoint in `store` (with `fallback`, an older one
        when the newest fails its checksums): weights, moments, step counts, data position.
        It reads into the live state: after a failure, restore again or discard the trainer."""
        groups = self._state_groups()
        saved = saved_steps(store)
        if self.trainer.ranks.world == 1 and (not saved or saved[0].gpus == 1
                                               and "ranks" not in saved[0].meta):
            newest = store.latest()
            if newest is not None:  # before reading tensors sized by settings that may differ
                self._check_resumable(newest.path, newest.meta)
            info, meta = store.load_latest_good(groups, fallback=fallback)
            linked = info
        else:
            info, meta, linked = self._restore_slices(store, saved, groups, fallback)
        self._check_resumable(info.path, meta)
        gpu = self.trainer.runner.gpu_blocks
        for b in self.trainer.blocks.blocks:
            taken = meta["steps_taken"][str(b)]
            if b in gpu:
                self.trainer.state.master[b].copy_(groups[f"block_{b}"]["master"])
                gpu.moments[b].copy_(self._gpu_moments_staging(groups, b))
                gpu.steps[b].fill_(taken)
            else:
                self.trainer.state.set_steps_taken(b, taken)
        self._restore_files(linked)
        data.load_state_dict(meta["data"])
        self.trainer.step = meta["step"]
        self.trainer.weights_changed()
        self.trainer.device.synchronize()
        return info

    def _restore_files(self, linked: CheckpointInfo | None) -> None:
        """Make the NVMe state files the checkpoint `linked` holds this run's (as many
        stripes as it holds: another count of drives re-stripes them); None: written already."""
        nvme = self.trainer.state.nvme
        if nvme is None or linked is None:
            return
        held = {path.name: path for path in linked.path.iterdir()}
        for b in nvme.disk_blocks:
            nvme.restore_files(b, state_file_stripes(held, b))

    def _restore_slices(self, store: CheckpointStore, saved: list[SavedStep], groups: dict,
                        fallback: bool) -> tuple[CheckpointInfo, dict, CheckpointInfo | None]:
        """Read this rank's slices of the newest step every rank reads whole (with
        `fallback`, an older one where a rank's part of it is damaged): the same step on every
        rank. Also the checkpoint whose NVMe files to restore (None: written already)."""
        if not saved:
            raise CheckpointError(f"no checkpoint in {store.root}")
        self._check_resumable(saved[0].infos[0].path, saved[0].meta)  # before reading tensors
        for candidate in saved:
            error = None
            try:
                found = self._read_slices(candidate, groups)
            except CheckpointCorruptError as e:
                error = e
            if self._every_rank(error is None):
                return found
            error = error or CheckpointCorruptError(
                f"another rank's part of step {candidate.step} in {store.root} is damaged")
            if not fallback:
                raise error
            warnings.warn(f"skipping step {candidate.step}: {error}", RuntimeWarning,
                          stacklevel=3)
        raise CheckpointCorruptError(f"every checkpoint in {store.root} is damaged")

    def _read_slices(self, saved: SavedStep,
                     groups: dict) -> tuple[CheckpointInfo, dict, CheckpointInfo | None]:
        """This rank's slices from one saved step: its own rank's checkpoint where the slices
        are the same (its NVMe files linked next), else cut out of every saved slice (this
        rank's NVMe files written here)."""
        self._check_resumable(saved.infos[0].path, saved.meta)
        state, local = self.trainer.state, self.trainer.ranks.local_rank
        theirs = slices_of(saved) or {b: s.numel for b, s in state.shards.items()}
        if saved.gpus == self.trainer.plan.placement.gpus and theirs == {
                b: s.slice_numel for b, s in state.shards.items()}:
            info = saved.infos[local]
            return info, saved.stores[local].load(info, groups), info
        if state.nvme is None:
            reslice(saved, groups, state.shards, local)
        else:
            reslice_with_disk(saved, groups, state.shards, local, state)
        return saved.infos[0], saved.meta, None

    def _every_rank(self, ok: bool) -> bool:
        """Whether every rank's ok is True (a collective of the main thread)."""
        if self.trainer.ranks.world == 1:
            return ok
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.trainer.ranks.group(None, "world"))
        return bool(flag[0])




def _state_identity(meta: dict) -> dict:
    """What a checkpoint's state means and how it is laid out: the model, the optimizer's
    settings but the decay's length, the moments' precision and the NVMe fractions (not the
    schedule, which a resumed run may change)."""
    policy = _with_defaults("policy", meta.get("policy"))
    residency = policy.get("residency", {}) if isinstance(policy, dict) else {}
    layout = {k: residency.get(k) for k in STATE_LAYOUT_FIELDS if k != "moment_precision"}
    optim = meta.get("optim")
    if isinstance(optim, dict):  # the schedule's length: a resume may train longer (--steps)
        optim = {k: v for k, v in optim.items() if k != "decay_steps"}
    return {"model": meta.get("model"), "optim": optim,
            "moment precision": residency.get("moment_precision"),
            "NVMe state layout": layout}


def _with_defaults(key: str, stored: object) -> object:
    """A checkpoint's stored policy or train settings read back through their dataclass, so
    that fields added since it was written take their defaults instead of differing."""
    kinds = {"policy": Policy, "train": TrainSpec}
    if key not in kinds or not isinstance(stored, dict):
        return stored
    try:
        settings = kinds[key].from_dict(stored).to_dict()
    except (TypeError, ValueError):
        return stored  # not ours to read: the comparison reports it
    return _what_it_computes(settings) if key == "policy" else settings


# policy fields that change how a run goes, not what it computes: a resumed run may differ there
RUN_ONLY_POLICY_FIELDS = ("executor", "stream_run_ahead")


def _what_it_computes(policy: dict) -> dict:
    """A policy's to_dict without the fields that say how a run goes (one level into its
    groups: executor is a group, stream_run_ahead a field of the schedule)."""
    return {group: {k: v for k, v in fields.items() if k not in RUN_ONLY_POLICY_FIELDS}
            for group, fields in policy.items() if group not in RUN_ONLY_POLICY_FIELDS}
