"""What each plan task does. The engine calls `TaskRunner.run(task)` on the task's lane; GPU work
is enqueued on that lane's stream, host work runs in the calling worker thread.

GPU memory: weight cache units are allocated once (the plan's window, plus dedicated units for
the embedding, the head and resident layers) and decoder-layer modules compute straight from
them. Activations, the gradient flowing backwards and weight grads come from torch's caching
allocator; handing them between streams is declared with record_stream.

Several ranks (Placement.gpus x hosts, executor/ranks.py) run the same plan on their own
micro-batches: a load sends this rank's slice of a block into its offset of the unit and the
gather lane's all-gather fills the rest; a block's grads, flat and padded, are reduce-scattered
into this rank's slice (and summed with the same slice's owners on the other hosts) before the
slice goes down; the clipping norm sums the ranks' partial squares.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch import nn

from layerslide.executor.blocks import EMBEDDING, ModelBlocks
from layerslide.executor.compute import (
    IGNORE_INDEX,
    add_embedding_grad,
    chunked_linear_cross_entropy,
    layer_call,
)
from layerslide.executor.device import LaneDevice
from layerslide.executor.gpu_updates import GpuUpdatedBlocks, add_into_sum
from layerslide.executor.grad_into_sum import attach_sums, detach_sums, route_linears
from layerslide.executor.grad_tasks import GradTasks, StepOutcome
from layerslide.executor.host_state import HostState
from layerslide.executor.nvme import ActivationFiles
from layerslide.executor.optim import OptimConfig
from layerslide.executor.rank_tasks import RankTasks
from layerslide.executor.units import WeightUnit
from layerslide.kernels.linear_cross_entropy import (
    fused_linear_cross_entropy,
    triton_head_available,
)
from layerslide.kinds import COMPUTE_KINDS, Lane, TaskKind
from layerslide.planner.model import ModelSpec
from layerslide.planner.plan import (
    DEDICATED,
    GPU_RESIDENT_LAYERS,
    GPU_UPDATED_STATE,
    GPU_WEIGHT_UNITS,
    HOST_CHECKPOINTS,
    NO_SLOT,
    Buffer,
    Placement,
    Plan,
    Task,
    block_weights_buffer_id,
    slot_space,
)


class Handoff:
    """Tensors passed between tasks (for a task of several micro-batches, a list of theirs),
    dropped once their last reader has taken them: by the id
    of the plan buffer they are (readers: its release tasks), or for what the plan does not
    size, the token ids and a tied model's LM-weight grad, by ("ids" | "tied", step, micro)."""

    def __init__(self):
        self._items: dict[tuple, list] = {}
        self._lock = threading.Lock()

    def put(self, key: tuple, value: torch.Tensor, readers: int) -> None:
        with self._lock:
            assert key not in self._items, key
            self._items[key] = [value, readers]

    def take(self, key: tuple) -> torch.Tensor:
        with self._lock:
            item = self._items[key]
            item[1] -= 1
            if item[1] == 0:
                del self._items[key]
            return item[0]


class TaskRunner(GradTasks, RankTasks):
    """Owns the GPU weight units and performs every task kind of a plan (those around a
    block's update in GradTasks, the collectives of several ranks in RankTasks)."""

    def __init__(self, blocks: ModelBlocks, spec: ModelSpec, placement: Placement,
                 state: HostState, device: LaneDevice, optim: OptimConfig):
        policy, train = state.policy, state.train
        self.blocks, self.spec, self.state, self.device, self.optim = (
            blocks, spec, state, device, optim)
        self.policy, self.train = policy, train
        self.L = blocks.num_layers
        dev = device.device
        self.load_source = placement.load_source
        landing = self.load_source == "master"
        # this rank among the ranks, the slices of each block it owns, and the rank count the
        # loss is averaged over (grads then sum over ranks)
        self.ranks, self.shards = state.ranks, state.shards
        self.world = placement.gpus * placement.hosts
        self.sharded = placement.gpus > 1
        self.gpu_updated = list(placement.gpu_updated)
        # a block's grads of the step's micro-batches summed in fp32 on the GPU and offloaded
        # once (layer-major), or offloaded one by one and summed on the host (step-major)
        self.sums_on_gpu = placement.grad_sums == "gpu"
        self.checkpoint_tier = placement.checkpoint_tier
        self.checkpoint_copies = placement.checkpoints_per_layer
        self._handlers = {kind: getattr(self, f"_do_{kind}") for kind in TaskKind}

        def unit(block: int, with_module: bool) -> WeightUnit:
            n, padded = blocks.numel(block), self.shards[block].padded_numel
            whole = torch.empty(padded, dtype=torch.bfloat16, device=dev)
            flat = whole[:n]
            module = None
            if with_module:
                with torch.device("meta"):
                    module = blocks.make_layer(max(block, 0))
                blocks.bind(module, block, flat)
                assert not any(t.is_meta for t in (*module.parameters(), *module.buffers()))
                route_linears(module)
            # blocks updated on the GPU are never loaded: no fp32 landing for them
            fp32 = (torch.empty(padded, dtype=torch.float32, device=dev)
                    if landing and block not in self.gpu_updated else None)
            return WeightUnit(flat=flat, module=module, landing_fp32=fp32,
                              padded=whole if padded > n else None)

        self.ring = [unit(0, True) for _ in range(placement.ring_units)]
        self.dedicated = {b: unit(b, True) for b in placement.dedicated_layers}
        self.dedicated[EMBEDDING] = unit(EMBEDDING, False)
        head = unit(self.L, False)
        with torch.device("meta"):  # named like the layout: norm.weight
            head.module = nn.ModuleDict({"norm": blocks.make_norm()})
        blocks.bind(head.module, self.L, head.flat)
        self.dedicated[self.L] = head
        self.gpu_blocks = GpuUpdatedBlocks(blocks, self.gpu_updated, dev, optim,
                                           state.moment_precision)
        self._rotary = blocks.make_rotary(dev)
        self._position_embeddings: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._call_layer = layer_call(policy.kernels.layer_kernels, dev)
        # fused: the Triton head on the GPU, its PyTorch twin (same math, more memory) on the
        # CPU; materialized: the PyTorch one over all tokens at once
        fused_on_gpu = (policy.kernels.head_loss == "fused" and dev.type == "cuda"
                        and triton_head_available(dev))
        self._head_loss = (fused_linear_cross_entropy if fused_on_gpu
                           else chunked_linear_cross_entropy)
        self.head_chunk_tokens = placement.head_chunk_tokens
        if policy.kernels.head_loss == "fused" and dev.type == "cuda" and not fused_on_gpu:
            # the plan sized chunks for the Triton head's 2 B per logit; the PyTorch one holds
            # ~10 (fp32 logits, exp, grad): a fifth of the rows keeps to the planned memory
            warnings.warn("Triton is not available: the head runs in PyTorch, slower, with "
                          "chunks of a fifth of the planned rows", RuntimeWarning, stacklevel=2)
            self.head_chunk_tokens = max(1, self.head_chunk_tokens // 5)
        # offloaded checkpoints: one view per layer and copy (a layer-major sweep keeps one per
        # micro-batch) into one page-locked buffer for all of them (checkpoint_views). Alone,
        # each layer's buffer under 64 MiB came from torch's pinned allocator, which rounds
        # up to a power of two: 3B micro-batch 8's 48 MiB checkpoints
        # took 64 MiB each, 0.44 GiB of RAM for nothing over 28 layers.
        self.act_host: dict[tuple[int, int], torch.Tensor] = {}  # (layer, copy) -> its view
        # activations on NVMe: checkpoints between offload and disk write, or read and fetch
        self.act_passing: dict[tuple[int, int, int], torch.Tensor] = {}
        self.activation_files = (ActivationFiles(self.state.nvme_dir, spec.num_layers,
                                                 self.checkpoint_copies)
                                 if self.checkpoint_tier == "nvme" else None)
        self._reset_segment()

    def allocated_bytes(self) -> dict[str, int]:
        """The GPU units and the host checkpoints' arena, by the ids of the plan's static
        buffers (its ledger); the checkpoints exist from the first offload on."""
        def nbytes(units) -> int:
            return sum(t.numel() * t.element_size() for u in units
                       for t in (u.flat if u.padded is None else u.padded, u.landing_fp32)
                       if t is not None)

        layers = [u for b, u in self.dedicated.items() if 0 <= b < self.L]
        held = {GPU_WEIGHT_UNITS: nbytes(self.ring), GPU_RESIDENT_LAYERS: nbytes(layers),
                GPU_UPDATED_STATE: self.gpu_blocks.state_bytes(),
                HOST_CHECKPOINTS: sum(t.numel() * t.element_size()
                                      for t in self.act_host.values())}
        for b in (EMBEDDING, self.L):
            held[block_weights_buffer_id(b, self.L)] = nbytes([self.dedicated[b]])
        return {k: v for k, v in held.items() if v}

    def _reset_segment(self) -> None:
        self.handoff = Handoff()
        self._made: dict[tuple[str, str], Buffer] = {}  # (task id, name) -> what it makes
        self._read: dict[tuple[str, str], Buffer] = {}  # and what it reads (releases)
        # (step, micro-batch) -> (input_ids, labels[, position_ids]) on the host
        self.batches: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        # packed documents: each micro-batch's rope and document mask, from its embedding's
        # forward to its backward
        self.attention: dict[tuple[int, int], tuple[tuple[torch.Tensor, torch.Tensor],
                                                    torch.Tensor]] = {}
        # cast=cpu_per_load: a load's bf16 staging copy, by (block, step, micro-batch, for_kind)
        self.staging: dict[tuple, torch.Tensor] = {}
        self.grads: dict[tuple[int, int, int], list[torch.Tensor]] = {}
        # several ranks: (step, micro-batch, block) -> a block's grads flat and padded, where
        # they are so already (a GPU sum's rounding), and this rank's slice of their sum
        self.padded_grads: dict[tuple[int, int, int], torch.Tensor] = {}
        self.reduced: dict[tuple[int, int, int], torch.Tensor] = {}
        # (step, micro-batch, block) -> its reduced slice's squared norm, inf where any rank's
        # slice of the host is non-finite
        self.reduced_sq: dict[tuple[int, int, int], torch.Tensor] = {}
        self.partial_sq: dict[int, float] = {}  # step -> this rank's slices' squared norm
        self.grad_sums: dict[tuple[int, int], torch.Tensor] = {}  # (step, block) -> fp32 sum
        self.grad_sq: dict[int, torch.Tensor] = {}  # step -> [A, L + 2] squared norms (host)
        self.final_sq: dict[int, torch.Tensor] = {}  # step -> [L + 2]: GPU-updated blocks' sums
        self.block_sq: dict[tuple[int, int], float] = {}
        self.clip_coef: dict[int, float] = {}
        self.outcomes: dict[int, StepOutcome] = {}
        self.step_offset = 0

    # --- a segment: one plan, run once ---------------------------------------------------------
    def prepare(self, plan: Plan, batches: dict[tuple[int, int], tuple[torch.Tensor, ...]],
                step_offset: int) -> None:
        """Check the plan's bindings against the units here and stage the segment's batches."""
        self._reset_segment()
        self.gpu_blocks.found_inf.clear()  # a stopped segment's steps that were never logged
        self.step_offset = step_offset
        pin = self.device.is_cuda
        self.batches = {k: tuple(t.pin_memory() if pin else t for t in batch)
                        for k, batch in batches.items()}
        for task in plan.tasks:  # raise where the plan names a unit or slot that is not here
            if task.kind in (*COMPUTE_KINDS, TaskKind.LOAD_WEIGHTS) and task.block >= 0:
                self._weight_unit(task)
            check_slot(task, plan.placement)
        self._made, self._read = plan.dataflow()
        for s in range(plan.num_steps):
            self.outcomes[s] = StepOutcome()
            self.grad_sq[s] = torch.zeros((self.train.grad_accum, self.L + 2),
                                          dtype=torch.float32, pin_memory=pin)
            self.final_sq[s] = torch.zeros(self.L + 2, dtype=torch.float32, pin_memory=pin)

    def run(self, task: Task) -> None:
        self._handlers[task.kind](task)

    # --- weights ---------------------------------------------------------------------------------
    def _weight_unit(self, task: Task) -> WeightUnit:
        """The unit the plan binds the task to: a ring unit, or the block's own."""
        if task.unit == DEDICATED:
            if task.block not in self.dedicated:
                raise ValueError(f"{task.id}: the plan gives block {task.block} no unit: its "
                                 "placement and tasks disagree")
            return self.dedicated[task.block]
        if not 0 <= task.unit < len(self.ring):
            raise ValueError(f"{task.id}: unit {task.unit} is not one of the plan's "
                             f"{len(self.ring)} ring units")
        return self.ring[task.unit]

    def _do_load_weights(self, task: Task) -> None:
        # this rank's slice of the block (the whole block on one rank) into its offset
        b = task.block
        start = self.state.start(b)
        target = self._weight_unit(task).arrivals[start:start + self.state.numel(b)]
        if self.load_source == "master":
            target.copy_(self.state.master[b], non_blocking=True)
        elif self.load_source == "staging":
            target.copy_(self.staging.pop(_load_key(task)), non_blocking=True)
        elif task.slot >= 0:  # the first part read from NVMe into a weight staging buffer
            staged = self.state.nvme.staged_weights(b, task.slot)
            target[:staged.numel()].copy_(staged, non_blocking=True)
            target[staged.numel():].copy_(self.state.upload[b], non_blocking=True)
        else:
            target.copy_(self.state.upload[b], non_blocking=True)

    def _do_cast(self, task: Task) -> None:
        staging = self.state.cast_to_upload(task.block)
        if task.for_kind:  # the cast of one load (cast=cpu_per_load)
            self.staging[_load_key(task)] = staging

    # --- compute ---------------------------------------------------------------------------------
    def _unit(self, task: Task) -> WeightUnit:
        unit = self._weight_unit(task)
        if task.casts_weights:
            unit.flat.copy_(unit.landing_fp32[:unit.flat.numel()])
        return unit

    def _hand_on(self, task: Task, name: str, tensor: torch.Tensor) -> None:
        """Keep the task's output `name` for the tasks the plan says read it."""
        buffer = self._made[(task.id, name)]
        self.handoff.put(buffer.id, tensor, readers=len(buffer.release_tasks))

    def _receive(self, task: Task, name: str) -> torch.Tensor:
        return self.handoff.take(self._read[(task.id, name)].id)

    def _rope(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        if seq_len not in self._position_embeddings:
            dev = self.device.device
            positions = torch.arange(seq_len, device=dev)[None]
            probe = torch.empty(1, dtype=torch.bfloat16, device=dev)
            self._position_embeddings[seq_len] = self._rotary(probe, positions)
        return self._position_embeddings[seq_len]

    def document_attention(self, positions_host: torch.Tensor):
        """The rope at packed documents' positions and their mask: a token sees the earlier
        tokens of its own document (a new one starts where positions restart)."""
        positions = positions_host.to(self.device.device, non_blocking=True)
        probe = torch.empty(1, dtype=torch.bfloat16, device=self.device.device)
        documents = torch.cumsum(positions == 0, dim=1)
        seq = positions.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=positions.device).tril_()
        mask = (documents[:, :, None] == documents[:, None, :]) & causal
        return self._rotary(probe, positions), mask[:, None]

    def _attend(self, s: int, m: int, positions_host: torch.Tensor) -> None:
        self.attention[(s, m)] = self.document_attention(positions_host)

    def call_layer(self, module: nn.Module, x: torch.Tensor, attention=None) -> torch.Tensor:
        """A decoder layer on hidden states x: causal, or within documents (`attention`, from
        document_attention)."""
        if attention is not None:
            rope, mask = attention
            return self._call_layer(module, x, rope, mask)
        return self._call_layer(module, x, self._rope(x.shape[1]))

    def _layer(self, module: nn.Module, x: torch.Tensor, s: int, m: int) -> torch.Tensor:
        return self.call_layer(module, x, self.attention.get((s, m)))

    # A compute or checkpoint task runs its micro-batches (Task.micro_batches, a layer-major
    # sweep's group) in turn: what it hands on is a list of their tensors, in that order.
    def _do_forward(self, task: Task) -> None:
        s, i = task.step, task.block
        unit = self._unit(task)
        if i == EMBEDDING:
            hidden = []
            for m in _micro_batches(task):
                ids_host, _, *positions = self.batches[(s, m)]
                if positions:
                    self._attend(s, m, positions[0])
                ids = ids_host.to(self.device.device, non_blocking=True)
                self.handoff.put(("ids", s, m), ids, readers=1)
                hidden.append(nn.functional.embedding(ids,
                                                      unit.flat.view(self.spec.vocab_size, -1)))
        else:
            with torch.no_grad():
                hidden = [self._layer(unit.module, x, s, m) for m, x in
                          zip(_micro_batches(task), self._receive(task, "checkpoint"),
                              strict=True)]
        # the next layer's checkpointed input, or the final hidden state for the head
        self._hand_on(task, "final_hidden" if i + 1 == self.L else "checkpoint", hidden)

    def _do_offload_activation(self, task: Task) -> None:
        for m, x in zip(_micro_batches(task), self._receive(task, "checkpoint"), strict=True):
            if self.checkpoint_tier == "nvme":
                # only between the copy and the disk write: from torch's pinned caching
                # allocator, which reuses the memory for the next layer's checkpoint
                host = ActivationFiles.host_buffer(x.numel(), x.dtype, self.device.is_cuda)
                self.act_passing[(task.step, m, task.block)] = host
            else:
                host = self.act_host.get(self._checkpoint_copy(task.block, m))
                if host is None or host.numel() != x.numel():
                    self.act_host = checkpoint_views(self.device, self.L, self.checkpoint_copies,
                                                     x.numel(), x.dtype)
                    host = self.act_host[self._checkpoint_copy(task.block, m)]
            self.device.keep_for(x, "d2h")
            host.copy_(x.view(-1), non_blocking=True)

    def _do_fetch_activation(self, task: Task) -> None:
        shape = (self.train.micro_batch, self.train.seq_len, self.spec.hidden_size)
        fetched = []
        for m in _micro_batches(task):
            if self.checkpoint_tier == "nvme":  # read back by its read_activation
                host = self.act_passing.pop((task.step, m, task.block))
            else:
                host = self.act_host[self._checkpoint_copy(task.block, m)]
            x = torch.empty(shape, dtype=host.dtype, device=self.device.device)
            x.view(-1).copy_(host, non_blocking=True)
            self.device.keep_for(x, "gpu")
            fetched.append(x)
        self._hand_on(task, "fetched", fetched)

    def _checkpoint_copy(self, layer: int, m: int) -> tuple[int, int]:
        """The (layer, copy) micro-batch m's checkpoint waits in: a copy per micro-batch of a
        sweep."""
        return layer, m % self.checkpoint_copies

    def _do_head(self, task: Task) -> None:
        s = task.step
        unit = self._unit(task)
        if self.blocks.tied:
            weight = self.dedicated[EMBEDDING].flat.view(self.spec.vocab_size, -1)
        else:
            weight = unit.flat[:self.spec.vocab_size * self.spec.hidden_size].view(
                self.spec.vocab_size, -1)
        # one micro-batch per call: its [V, h] LM-weight grad and logits go before the next's
        dgrads = [self._head_micro_batch(s, m, unit, weight, hidden) for m, hidden in
                  zip(_micro_batches(task), self._receive(task, "final_hidden"), strict=True)]
        self._hand_on(task, "dgrad", dgrads)

    def _head_micro_batch(self, s: int, m: int, unit: WeightUnit, weight: torch.Tensor,
                          hidden: torch.Tensor) -> torch.Tensor:
        """The head's forward and backward of micro-batch m: its grads kept, its dgrad back."""
        norm = unit.module["norm"]
        x = hidden.detach().requires_grad_(True)
        labels_host = self.batches[(s, m)][1]
        labels = labels_host.to(self.device.device, non_blocking=True).view(-1)
        with torch.enable_grad():
            normed = norm(x)
        flat = normed.detach().view(-1, normed.shape[-1])
        count = (labels != IGNORE_INDEX).sum()
        # the mean over the step's micro-batches of every rank: grads then sum over the ranks
        scale = 1.0 / (count.clamp(min=1).float() * self.train.grad_accum * self.world)
        loss, d_flat, d_weight = self._head_loss(
            flat, weight, labels, scale, self.head_chunk_tokens)
        self.outcomes[s].loss_parts.append(loss * scale)
        normed.backward(d_flat.view_as(normed))
        head_grads = [p.grad for p in _params_in_layout(self.blocks, self.L, unit.module)]
        for p in norm.parameters():
            p.grad = None
        if self.blocks.tied and self.sums_on_gpu:  # into the embedding's sum: one [V, h] alive
            add_into_sum(self.blocks, EMBEDDING, self._grad_sum(s, EMBEDDING), [d_weight],
                         first=m == 0)
        elif self.blocks.tied:
            self.handoff.put(("tied", s, m), d_weight, readers=1)
        else:
            head_grads.insert(0, d_weight)  # the LM head comes first in the block's layout
        del d_weight, d_flat  # held by head_grads or summed: none of them past the keeping
        self._keep_grads(s, m, self.L, head_grads)
        return x.grad

    def _do_backward(self, task: Task) -> None:
        s, i = task.step, task.block
        dgrads = self._receive(task, "dgrad")
        if i == EMBEDDING:
            for m, dgrad in zip(_micro_batches(task), dgrads, strict=True):
                self._embedding_backward(s, m, dgrad)
            return
        unit = self._unit(task)
        # its checkpointed inputs: fetched back for it, or kept on the GPU since its forward
        fetched = (task.id, "fetched") in self._read
        inputs = self._receive(task, "fetched" if fetched else "checkpoint")
        params = _params_in_layout(self.blocks, i, unit.module)
        passed = [self._layer_backward(s, m, i, unit, params, saved, dgrad) for m, saved, dgrad
                  in zip(_micro_batches(task), inputs, dgrads, strict=True)]
        self._hand_on(task, "dgrad", passed)

    def _layer_backward(self, s: int, m: int, i: int, unit: WeightUnit,
                        params: list[nn.Parameter], saved: torch.Tensor,
                        dgrad: torch.Tensor) -> torch.Tensor:
        """Layer i's recompute and backward of micro-batch m: its grads kept (autograd's
        released from the parameters first), its input's grad back."""
        x = saved.detach().requires_grad_(True)
        into_sum = self.sums_on_gpu and i not in self.gpu_blocks  # the weight GEMMs add in
        if into_sum:
            attach_sums(unit.module, self.blocks, i, self._grad_sum(s, i))
        with torch.enable_grad():
            y = self._layer(unit.module, x, s, m)
        y.backward(dgrad)
        if into_sum:
            detach_sums(unit.module)
        grads = [p.grad for p in params]  # None where the grad went into the sum
        for p in params:
            p.grad = None
        self._keep_grads(s, m, i, grads)
        return x.grad

    def _embedding_backward(self, s: int, m: int, dgrad: torch.Tensor) -> None:
        self.attention.pop((s, m), None)  # its last layer has run
        ids = self.handoff.take(("ids", s, m))
        if self.blocks.tied and self.sums_on_gpu:  # into the sum the heads started
            vocab = self.spec.vocab_size
            add_embedding_grad(self._grad_sum(s, EMBEDDING).view(vocab, -1), dgrad, ids)
            self._summed(s, m, EMBEDDING)
            return
        if self.blocks.tied:  # into the head's LM-weight grad: no second [V, h] tensor
            grads = [add_embedding_grad(self.handoff.take(("tied", s, m)), dgrad, ids)]
        else:
            grads = [torch.ops.aten.embedding_dense_backward(
                dgrad, ids, self.spec.vocab_size, -1, False)]
        # the list is the grad's only holder: summed on the GPU, it goes before the sum is
        # rounded (a local name kept it through the rounding, a third [V, h] block beside the
        # sum and its rounded copy: benchmarks/results/archive/validation_2026-12-04)
        self._keep_grads(s, m, EMBEDDING, grads)

    def load_gpu_state(self) -> None:
        """Put the GPU-updated blocks' master weights (from the host) and bf16 weights in place."""
        for b in self.gpu_updated:
            self.gpu_blocks.load(b, self.state.master[b], self.dedicated[b].flat)

    def store_gpu_state(self) -> None:
        """Copy the GPU-updated blocks' master weights back into the host state."""
        for b in self.gpu_updated:
            self.gpu_blocks.store(b, self.state.master[b])

    def _keep_grads(self, s: int, m: int, block: int, grads: list[torch.Tensor]) -> None:
        if block in self.gpu_blocks or self.sums_on_gpu:  # summed in fp32 on the GPU
            add_into_sum(self.blocks, block, self._grad_sum(s, block), grads, first=m == 0)
            grads.clear()  # autograd's bf16 grads go before the sum is rounded for the offload
            self._summed(s, m, block)
            return
        self._await_offload(s, m, block, grads)

    def _await_offload(self, s: int, m: int, block: int, grads: list[torch.Tensor]) -> None:
        """Keep the grads (in layout order) and their squared norm for the block's offload
        (several ranks: for the collective before it, the norm then the reduced slice's)."""
        if self.world > 1:
            self.grads[(s, m, block)] = grads
            return
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        grads.append(torch.stack(norms).square().sum())
        self.grads[(s, m, block)] = grads

    def _grad_sum(self, s: int, block: int) -> torch.Tensor:
        """The block's fp32 grad sum for step s: a GPU-updated block's own, or (layer-major)
        one made by the step's first micro-batch and dropped once rounded for the offload."""
        if block in self.gpu_blocks:
            return self.gpu_blocks.grad_sum[block]
        if (s, block) not in self.grad_sums:
            # padded for several ranks: its bf16 rounding is then what the reduce-scatter takes
            self.grad_sums[(s, block)] = torch.zeros(self.shards[block].padded_numel,
                                                     dtype=torch.float32,
                                                     device=self.device.device)
        return self.grad_sums[(s, block)]

    def _summed(self, s: int, m: int, block: int) -> None:
        """Micro-batch m's grads are in the block's sum: after the step's last, a GPU-updated
        block's squared norm goes to the host; another's sum, rounded to bf16, awaits its
        offload."""
        if m < self.train.grad_accum - 1:
            return
        if block in self.gpu_blocks:
            self.final_sq[s][block + 1].copy_(self.gpu_blocks.grad_sq_norm(block),
                                              non_blocking=True)
            return
        rounded = self.grad_sums.pop((s, block)).to(torch.bfloat16)
        if self.world > 1:
            self.padded_grads[(s, m, block)] = rounded
        self._await_offload(s, m, block, [view for _, view in self.blocks.views(block, rounded)])

    # --- the NVMe tier: activation checkpoints -----------------------------------------------
    def _do_read_activation(self, task: Task) -> None:
        # into pinned buffers the fetch copies to the GPU
        numel = self.train.tokens_per_micro_batch * self.spec.hidden_size
        for m in _micro_batches(task):
            host = ActivationFiles.host_buffer(numel, torch.bfloat16, self.device.is_cuda)
            layer, copy = self._checkpoint_copy(task.block, m)
            self.activation_files.read(layer, host, copy)
            self.act_passing[(task.step, m, task.block)] = host

    def _do_write_activation(self, task: Task) -> None:
        for m in _micro_batches(task):
            host = self.act_passing.pop((task.step, m, task.block))
            layer, copy = self._checkpoint_copy(task.block, m)
            self.activation_files.write(layer, host, copy)


def check_slot(task: Task, placement: Placement) -> None:
    """A slot the task takes must be one of the buffers the placement holds for its space
    (planner.plan.SLOT_SPACES); ValueError names the task otherwise."""
    space = slot_space(task.kind)
    count = None if space is None else space.placed(placement)
    if count is None or (task.slot == NO_SLOT and not _takes_slot(task, placement)):
        return
    if not 0 <= task.slot < count:
        raise ValueError(f"{task.id}: slot {task.slot} is not one of the plan's {count} "
                         f"{space.what} buffers")


def _takes_slot(task: Task, placement: Placement) -> bool:
    """Whether the task's handler takes a buffer of its slot space's pool, so that it must
    name one: every NVMe read and write of state or weights, and where grads land in a pool,
    each host task that reads them (an optimizer step does only without host sums)."""
    if task.kind in (TaskKind.READ_STATE, TaskKind.WRITE_STATE, TaskKind.READ_WEIGHTS):
        return True
    if placement.grad_landing != "pool" or task.lane == Lane.GPU:
        return False
    return task.kind in (TaskKind.OFFLOAD_GRADS, TaskKind.ACCUMULATE_GRADS) or (
        task.kind == TaskKind.OPTIMIZER_STEP and placement.grad_sums != "host")


def _micro_batches(task: Task) -> range:
    return range(task.micro_batch, task.micro_batch + task.micro_batches)


def _load_key(task: Task) -> tuple:
    """What a load and the cast made for it share (cast=cpu_per_load)."""
    return task.block, task.step, task.micro_batch, task.for_kind


def checkpoint_views(device: LaneDevice, layers: int, copies: int, numel: int,
                     dtype: torch.dtype) -> dict[tuple[int, int], torch.Tensor]:
    """One host buffer of `copies` checkpoints of `numel` elements for each of `layers` (page-
    locked where a GPU copies into it), and each (layer, copy)'s view of it."""
    arena = device.host_empty(layers * copies * numel, dtype)
    return {(i, c): arena[(i * copies + c) * numel:(i * copies + c + 1) * numel]
            for i in range(layers) for c in range(copies)}


def _params_in_layout(blocks: ModelBlocks, block: int, module: nn.Module) -> list[nn.Parameter]:
    """The module's parameters in the order of the block's flat layout (the head's LM weight,
    tied or not, is handled by the caller)."""
    owned = dict(module.named_parameters())
    return [owned[s.local_name] for s in blocks.layouts[block] if s.local_name in owned]
