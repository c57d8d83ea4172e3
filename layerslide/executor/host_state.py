"""Training state on the host: per block fp32 master weights, AdamW moments and the buffers the
plan's host-side tasks fill (bf16 weights to upload, landed bf16 grads, fp32 grads), laid out as
the plan's Placement says: where the grads land in the bf16 upload copies there are no landing
buffers.

Each block's state is one flat buffer, so one AdamW call updates it: the decayed matrices are at
the front, norms and biases behind them. The call is layerslide's native one-pass kernel (reads
the landed bf16 grads, may write the bf16 upload copy) or torch's fused AdamW, multi-threaded and
as fast as DeepSpeed's on the benchmark machine but needing fp32 grads and a separate cast.
The moments are kept in the placement's moment precision (executor/moments.py; compact ones
need the native kernel). What lives where is the plan's Placement: this state never reads the
policy's residency or schedule.

With several ranks on a host (Placement.gpus) each holds only its slice of every block
(planner/sharding.py): the elements from `start(block)` on, `numel(block)` of them, padded with
zeros past the block's end; everything here (master, moments, upload copies, landed grads, NVMe
files) is that slice, and the block's element indices (the bf16 moments' noise, the decay's
end) count from the block's start, so that N ranks compute what one rank would.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

import torch
from torch import nn

from layerslide.executor.blocks import ModelBlocks
from layerslide.executor.collectives import owned_part, whole_from_slices
from layerslide.executor.device import LaneDevice
from layerslide.executor.moments import Moments, moment_seed
from layerslide.executor.native import load_kernels
from layerslide.executor.nvme import (
    ActivationFiles,
    NvmeFolderLocks,
    NvmeState,
    check_nvme_folder,
    nvme_folders,
)
from layerslide.executor.optim import OptimConfig
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.executor.stripes import padded
from layerslide.kinds import Lane
from layerslide.planner.plan import (
    HOST_GRAD_ACCUM,
    HOST_GRAD_LANDING,
    HOST_MASTER,
    HOST_MOMENTS,
    HOST_UPLOAD,
    NVME_MASTER,
    NVME_MOMENTS,
    NVME_WEIGHTS,
    Placement,
)
from layerslide.planner.settings import Policy, TrainSpec
from layerslide.planner.sharding import Shards


class HostState:
    """Owns the host tensors of every block and one AdamW per block."""

    def __init__(self, blocks: ModelBlocks, device: LaneDevice, policy: Policy, train: TrainSpec,
                 optim: OptimConfig, placement: Placement, *,
                 nvme_dir: str | Path | None = None, nvme_checkpoint_copies: int = 0,
                 ranks: Ranks = SINGLE):
        self.blocks, self.device, self.policy, self.train, self.optim = (
            blocks, device, policy, train, optim)
        # this rank's slice of each block: the whole block on one rank
        self.ranks = ranks
        self.shards = {b: Shards(blocks.numel(b), placement.gpus) for b in blocks.blocks}
        # blocks updated on the GPU keep only their master weights here (for load and save)
        cpu_blocks = [b for b in blocks.blocks if b not in placement.gpu_updated]
        # native: our one-pass kernel; else torch's fused AdamW, its state seeded with views of
        # the same flat moments, so that both keep (and checkpoint) one m and one v per block
        knobs = policy.executor
        self.native = (load_kernels(threads=cpu_threads(knobs.cpu_threads, placement.gpus),
                                    chunk=knobs.cpu_chunk_elements, nice=knobs.cpu_nice)
                       if policy.kernels.cpu_optimizer == "native" else None)
        # the first elements of each block's master weights / moments live on disk, as many
        # as the plan's placement says, the rest here (self.master and self.moments hold that
        # rest; blocks updated on the GPU keep theirs whole)
        self.disk_master = {b: placement.disk_numel(b)[0] for b in cpu_blocks}
        self.disk_moments = {b: placement.disk_numel(b)[1] for b in cpu_blocks}
        # likewise the first elements of its bf16 upload copy (self.upload holds the rest)
        self.disk_weights = {b: placement.disk_weights_numel(b) for b in cpu_blocks}
        self._open_nvme(placement, train, nvme_dir, nvme_checkpoint_copies)
        self._allocate_weights(placement, cpu_blocks)
        self._allocate_grads(placement, cpu_blocks)
        self._allocate_optimizer_state(placement, cpu_blocks)

    def numel(self, block: int) -> int:
        """Elements of the block this rank holds (its slice, padding included)."""
        return self.shards[block].slice_numel

    def start(self, block: int) -> int:
        """Where this rank's slice starts in the block's flat layout."""
        return self.shards[block].start(self.ranks.local_rank)

    def _open_nvme(self, placement: Placement, train: TrainSpec, nvme_dir, checkpoint_copies):
        """The NVMe tier's folders, locked and checked for room before any RAM is allocated:
        the state's files (NvmeState) and the activation checkpoints' files."""
        self.nvme = None
        # the tier's folders, one per drive (NvmeState stripes each block's file over them)
        self.nvme_dir = None if nvme_dir is None else nvme_folders(nvme_dir)
        if placement.uses_nvme and nvme_dir is None:
            raise ValueError(f"the plan keeps {' and '.join(_on_nvme(placement))} on NVMe: "
                             "pass a folder on that disk (--nvme-dir)")
        # one run a folder: the file names are fixed, and a run's end deletes its files
        self.nvme_locks = NvmeFolderLocks(self.nvme_dir) if placement.uses_nvme else None
        # activation checkpoints on NVMe: a file per layer and checkpoint waiting at once
        # (per folder: they are dealt out over the folders in turn)
        per_file = padded(2 * train.tokens_per_micro_batch * self.blocks.config.hidden_size)
        activation_bytes = (per_file * ActivationFiles.files_per_folder(
            self.blocks.num_layers, placement.checkpoints_per_layer, len(self.nvme_dir))
            if placement.checkpoint_tier == "nvme" and self.nvme_dir else 0)
        if placement.state_on_nvme:
            if self.native is None:
                raise ValueError("state on NVMe needs layerslide's native CPU AdamW "
                                 "(cpu_optimizer='native' and a C compiler, LAYERSLIDE_NATIVE "
                                 "not 0): torch's AdamW keeps whole moments in RAM")
            self.nvme = NvmeState(nvme_dir, self.disk_master, self.disk_moments,
                                  placement.nvme_staging_slots, weights_numel=self.disk_weights,
                                  weight_staging_buffers=placement.weight_staging_slots,
                                  pin=self.device.pin, extra_bytes=activation_bytes,
                                  checkpoint_copies=checkpoint_copies,
                                  moment_precision=placement.moment_precision)
        elif activation_bytes:
            for folder in self.nvme_dir:
                check_nvme_folder(folder, activation_bytes)

    def _allocate_weights(self, placement: Placement, cpu_blocks: list[int]) -> None:
        """The fp32 master weights' RAM part, and the bf16 upload copies loads send."""
        blocks, device = self.blocks, self.device
        # loads that send the fp32 master weights over PCIe need them page-locked
        pin_master = placement.load_source == "master"
        self.master = {b: device.host_empty(self.numel(b) - self.disk_master.get(b, 0),
                                            torch.float32, pinned=pin_master)
                       for b in blocks.blocks}
        if placement.gpus > 1:  # the padding past a block's end stays zero: so do its updates
            for tensor in self.master.values():
                tensor.zero_()
        self.upload = ({b: device.host_empty(self.numel(b) - self.disk_weights[b],
                                             torch.bfloat16)
                        for b in cpu_blocks} if placement.load_source == "upload" else {})
        self.writes_upload = placement.optimizer_writes_upload

    def _allocate_grads(self, placement: Placement, cpu_blocks: list[int]) -> None:
        """Where offloaded bf16 grads land: in the block's upload copy, one buffer per block, or
        a pool whose buffers the plan's tasks name (its backpressure edges make reuse safe);
        and the fp32 sums of a step's micro-batches where the host sums them."""
        device = self.device
        self.land_in_upload = placement.grad_landing == "upload"
        self.landing_pool: list[torch.Tensor] = []
        self.landing: dict[int, torch.Tensor] = {}
        if placement.grad_landing == "pool":
            largest = max(self.numel(b) for b in cpu_blocks)
            self.landing_pool = [device.host_empty(largest, torch.bfloat16)
                                 for _ in range(placement.grad_landing_buffers)]
        elif not self.land_in_upload:
            self.landing = {b: device.host_empty(self.numel(b), torch.bfloat16)
                            for b in cpu_blocks}
        self.sums_on_host = placement.grad_sums == "host"
        self.grad32 = ({b: torch.empty(self.numel(b), dtype=torch.float32)
                        for b in cpu_blocks} if self.sums_on_host else {})

    def _allocate_optimizer_state(self, placement: Placement, cpu_blocks: list[int]) -> None:
        """Each CPU-updated block's moments (their RAM part) and step count; torch's AdamW where
        the native kernel is not used."""
        self._scratch = None  # torch's AdamW: one fp32 upcast buffer, reused block by block
        self._params: dict[int, list[nn.Parameter]] = {}
        self.optimizers: dict[int, torch.optim.AdamW] = {}
        self.moment_precision = placement.moment_precision
        self.moments: dict[int, Moments] = {}  # each block's RAM part
        self.steps_taken = dict.fromkeys(cpu_blocks, 0)
        # a checkpoint being written beside training (checkpoint_snapshot.SnapshotGuard):
        # each update first lets it take the block's state
        self.update_guard = None
        for b in cpu_blocks:
            ram = self.numel(b) - self.disk_moments[b]
            self.moments[b] = Moments.zeros(self.moment_precision, ram)
            if self.native is None:
                self._params[b], self.optimizers[b] = self._make_optimizer(b)

    def _make_optimizer(self, block: int) -> tuple[list[nn.Parameter], torch.optim.AdamW]:
        split = self._decay_end(block, 0, self.numel(block))
        flat = self.master[block]
        exp_avg, exp_avg_sq = (self.moments[block].tensors[name]
                               for name in ("exp_avg", "exp_avg_sq"))  # fp32: Policy checks
        groups, params, parts = [], [], []
        for part, decay in ((slice(0, split), self.optim.weight_decay),
                            (slice(split, None), 0.0)):
            if flat[part].numel():
                param = nn.Parameter(flat[part])  # shares the flat buffer's storage
                params.append(param)
                parts.append(part)
                groups.append({"params": [param], "weight_decay": decay})
        opt = torch.optim.AdamW(groups, lr=self.optim.lr, betas=(self.optim.beta1,
                                self.optim.beta2), eps=self.optim.eps, fused=True)
        for param, part in zip(params, parts, strict=True):
            # AdamW only initialises a parameter's state when it finds none
            opt.state[param] = {"step": torch.tensor(0.0), "exp_avg": exp_avg[part],
                                "exp_avg_sq": exp_avg_sq[part]}
        return params, opt

    def set_steps_taken(self, block: int, steps: int) -> None:
        """The optimizer steps a block has taken (its AdamW bias correction), e.g. on resume."""
        self.steps_taken[block] = steps
        for param in self._params.get(block, ()):
            self.optimizers[block].state[param]["step"].fill_(steps)

    # --- weights -------------------------------------------------------------------------------
    def owned_master(self, block: int) -> torch.Tensor:
        """This rank's slice of the block's fp32 master weights (the whole block on one rank):
        the RAM tensor itself, or (part on NVMe) a fresh copy of disk part + RAM part. Not for
        the training loop: it reads the disk."""
        k = self.disk_master.get(block, 0)
        if not k:
            return self.master[block]
        disk_part = self.nvme.read_block(block)[0]
        return torch.cat([disk_part, self.master[block]])

    def whole_master(self, block: int) -> torch.Tensor:
        """The block's whole fp32 master weights: with several ranks on the host gathered from
        their slices, a collective every rank of the host calls in the same order (in the main
        thread, between segments: it takes the gather lane's group while that lane is idle)."""
        if self.shards[block].ranks == 1:
            return self.owned_master(block)
        return whole_from_slices(self.owned_master(block), self.shards[block],
                                 self.ranks.local_rank, self.ranks.group(Lane.GATHER, "host"))

    def set_owned(self, block: int, values: torch.Tensor) -> None:
        """Set this rank's slice of the block's master weights (numel(block) values)."""
        values = values.reshape(-1)
        k = self.disk_master.get(block, 0)
        self.master[block].copy_(values[k:])
        if k:
            self.nvme.update_block(block, master=values[:k])

    def set_master(self, block: int, values: torch.Tensor) -> None:
        """Set the block's master weights from the whole block's values (this rank keeps its
        slice of them)."""
        self.set_owned(block, owned_part(values.reshape(-1), self.shards[block],
                                         self.ranks.local_rank))

    def load_named(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy named HF tensors into the master weights (the part of each in this rank's
        slice); returns the names it placed. A block with master weights on NVMe is gathered
        whole, then written once all of it is in."""
        where = {s.name: (b, s) for b in self.blocks.blocks for s in self.blocks.layouts[b]}
        placed, gathering, missing = set(), {}, {}
        for name, tensor in tensors:
            if name not in where:
                continue
            block, slot = where[name]
            if tuple(tensor.shape) != slot.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} in the checkpoint, "
                                 f"{slot.shape} in config.json")
            placed.add(name)
            if not self.disk_master.get(block, 0):
                self._copy_owned(block, slot, tensor, self.master[block])
                continue
            if block not in gathering:
                gathering[block] = self.owned_master(block)
                missing[block] = {s.name for s in self.blocks.layouts[block]}
            self._copy_owned(block, slot, tensor, gathering[block])
            missing[block].discard(name)
            if not missing[block]:
                self.set_owned(block, gathering.pop(block))
        for block, owned in gathering.items():  # partly placed: the caller reports what's missing
            self.set_owned(block, owned)
        return placed

    def _copy_owned(self, block: int, slot, tensor: torch.Tensor, owned: torch.Tensor) -> None:
        """Copy the part of one parameter's values that falls in this rank's slice into
        `owned` (the slice's values)."""
        start = self.start(block)
        lo = max(slot.offset, start)
        hi = min(slot.offset + slot.numel, start + self.numel(block))
        if lo < hi:
            owned[lo - start:hi - start].copy_(
                tensor.reshape(-1)[lo - slot.offset:hi - slot.offset])

    def named_master(self) -> Iterable[tuple[str, torch.Tensor]]:
        """(state-dict name, fp32 view) of every parameter, block by block (with several ranks
        a collective: see whole_master)."""
        for b in self.blocks.blocks:
            for slot, view in self.blocks.views(b, self.whole_master(b)):
                yield slot.name, view

    def cast_to_upload(self, block: int) -> torch.Tensor:
        """fp32 master -> the bf16 copy the GPU loads (cast=cpu_once), or a fresh staging copy
        (of this rank's slice)."""
        target = self.upload.get(block)
        if target is None:  # cast per load: staging from torch's pinned caching allocator,
            # which recycles a buffer once the copy that reads it has finished
            target = torch.empty(self.numel(block), dtype=torch.bfloat16,
                                 pin_memory=self.device.is_cuda)
        master = self.owned_master(block)
        k = self.disk_weights.get(block, 0)
        if k:  # the first k to the block's file, the rest to the RAM copy
            whole = torch.empty(self.numel(block), dtype=torch.bfloat16)
            self.native.cast(master, whole)
            self.nvme.update_block(block, weights=whole[:k])
            target.copy_(whole[k:])
        elif self.native is not None:
            self.native.cast(master, target)
        else:
            target.copy_(master)
        return target

    # --- gradients and the update --------------------------------------------------------------
    def landing_buffer(self, block: int, pool_slot: int) -> torch.Tensor:
        """The bf16 buffer a block's offloaded grads land in (pool_slot: the pool's buffer the
        plan gives them, where they land in a pool)."""
        if self.land_in_upload:
            return self.upload[block]
        if self.landing_pool:
            return self.landing_pool[pool_slot][:self.numel(block)]
        return self.landing[block]

    def accumulate(self, block: int, micro_batch: int, landed: torch.Tensor) -> None:
        """Add the landed bf16 grads of one micro-batch into the block's fp32 sum."""
        if self.native is not None and landed.dtype == torch.bfloat16 and landed.is_contiguous():
            self.native.accumulate(self.grad32[block], landed, first=micro_batch == 0)
        elif micro_batch == 0:
            self.grad32[block].copy_(landed)
        else:
            self.grad32[block].add_(landed)

    def host_grad_sq_norm(self, block: int) -> float:
        """Squared L2 norm of the block's accumulated fp32 grads (fp64 sum)."""
        return float(torch.linalg.vector_norm(self.grad32[block], dtype=torch.float64) ** 2)

    def step(self, block: int, lr: float, clip_coef: float, landed: torch.Tensor | None) -> None:
        """One AdamW step of the block with its grads (the fp32 sum, or the landed bf16 grads
        when not accumulating) scaled by clip_coef; where the optimizer writes the upload copy
        (Placement.optimizer_writes_upload) the bf16 weights are refreshed in the same pass."""
        if self.update_guard is not None:
            self.update_guard.before_update(block)
        grads = self.grad32[block] if self.sums_on_host else landed
        self.steps_taken[block] += 1
        if self.native is not None:
            casts = self.writes_upload
            step = self.steps_taken[block]
            for part, param, moments, weights in self._state_parts(block):
                self.native.adamw_step_moments(
                    param=param, moments=moments, grad=grads[part],
                    weights_out=weights if casts else None,
                    decay_end=self._decay_end(block, part.start, param.numel()),
                    lr=lr, beta1=self.optim.beta1, beta2=self.optim.beta2, eps=self.optim.eps,
                    weight_decay=self.optim.weight_decay, grad_scale=clip_coef, step=step,
                    seed=moment_seed(block, step), index_base=self.start(block) + part.start)
            return
        self._torch_step(block, grads, lr, clip_coef)
        if self.writes_upload:  # no native kernel here: the plan still has no casts
            self.upload[block].copy_(self.master[block])

    def _decay_end(self, block: int, offset: int, numel: int) -> int:
        """How many of the `numel` elements from `offset` in this rank's slice get weight decay
        (the block's matrices come first)."""
        return min(max(self.blocks.decay_numel(block) - self.start(block) - offset, 0), numel)

    def restore_upload(self, block: int) -> None:
        """After a skipped update: the upload copy holds the landed grads, not the weights, or
        (weights on NVMe) the staged weights part is not yet written; cast the (unchanged)
        master weights back into them. The disk part of the master is read from the staging
        buffer the plan's NVMe read filled, as the update would have."""
        if block not in self.upload or not (self.land_in_upload or self.disk_weights[block]):
            return
        for _, param, _, weights in self._state_parts(block):
            if self.native is not None:
                self.native.cast(param, weights)
            else:
                weights.copy_(param)

    def _state_parts(self, block: int):
        """(slice of the block, master, Moments, bf16 weights) runs of its parameters, each run
        wholly in one place per tensor: the disk parts (in the staging buffer the plan's NVMe
        read filled) come first, then the RAM parts. The weights are the upload copy's, None
        without one. (8-bit moments: the plan cuts at whole scale blocks, so every run is.)"""
        n, km, kv = self.numel(block), self.disk_master[block], self.disk_moments[block]
        kw = self.disk_weights[block]
        if km or kv or kw:
            slot = self.nvme.slot_of_block[block]
            disk_p, disk_moments = self.nvme.views(block, slot)
            disk_w = self.nvme.weights_view(block, slot)
        ram_p, ram_moments = self.master[block], self.moments[block]
        ram_w = self.upload.get(block)
        cuts = sorted({0, km, kv, kw, n})
        for a, b in pairwise(cuts):
            param = disk_p[a:b] if b <= km else ram_p[a - km:b - km]
            moments = (disk_moments.part(a, b) if b <= kv
                       else ram_moments.part(a - kv, b - kv))
            weights = (disk_w[a:b] if b <= kw else
                       None if ram_w is None else ram_w[a - kw:b - kw])
            yield slice(a, b), param, moments, weights

    def _torch_step(self, block: int, grads: torch.Tensor, lr: float, clip_coef: float) -> None:
        if grads.dtype != torch.float32:  # torch's fused AdamW needs fp32 grads
            grads = self._upcast(block).copy_(grads)  # then scale in fp32, not in bf16
        if clip_coef != 1.0:
            grads.mul_(clip_coef)
        offset = 0
        for param in self._params[block]:
            param.grad = grads[offset:offset + param.numel()]
            offset += param.numel()
        opt = self.optimizers[block]
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for param in self._params[block]:
            param.grad = None

    def _upcast(self, block: int) -> torch.Tensor:
        if self._scratch is None:
            self._scratch = torch.empty(max(self.numel(b) for b in self.master),
                                        dtype=torch.float32)
        return self._scratch[:self.numel(block)]

    def allocated_bytes(self) -> dict[str, int]:
        """What this state holds, by the ids of the plan's static buffers (its ledger)."""
        def nbytes(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        held = {HOST_MASTER: nbytes(self.master.values()),
                HOST_MOMENTS: sum(moments.nbytes for moments in self.moments.values()),
                HOST_UPLOAD: nbytes(self.upload.values()),
                HOST_GRAD_LANDING: nbytes([*self.landing.values(), *self.landing_pool]),
                HOST_GRAD_ACCUM: nbytes(self.grad32.values()),
                # the files' contents; each file is padded to the disk's O_DIRECT alignment
                NVME_MASTER: 4 * sum(self.disk_master.values()),
                NVME_MOMENTS: sum(Moments.nbytes_of(self.moment_precision, k)
                                  for k in self.disk_moments.values()),
                NVME_WEIGHTS: 2 * sum(self.disk_weights.values())}
        return {k: v for k, v in held.items() if v}

    def state_bytes(self) -> int:
        """Host bytes held by this state (master, moments, upload and grad buffers)."""
        tensors = [*self.master.values(), *self.upload.values(), *self.landing.values(),
                   *self.landing_pool, *self.grad32.values()]
        if self._scratch is not None:
            tensors.append(self._scratch)
        total = sum(t.numel() * t.element_size() for t in tensors)
        return total + sum(moments.nbytes for moments in self.moments.values())


def cpu_threads(asked: int, ranks_on_host: int) -> int:
    """The native kernels' threads: as asked, else (0) OpenMP's count on one rank, and with
    several ranks on a host this rank's share of the cores it may run on (torchrun sets
    OMP_NUM_THREADS=1 for each, which would leave one core to each rank's AdamW)."""
    if asked or ranks_on_host == 1:
        return asked
    return max(1, len(os.sched_getaffinity(0)) // ranks_on_host)


def _on_nvme(placement: Placement) -> list[str]:
    """What the placement keeps on NVMe, as a message names it."""
    parts = (("master weights", placement.master_on_nvme), ("moments", placement.moments_on_nvme),
             ("bf16 weights", placement.weights_on_nvme))
    return ([name for name, numel in parts if any(numel)]
            + (["activation checkpoints"] if placement.checkpoint_tier == "nvme" else []))
