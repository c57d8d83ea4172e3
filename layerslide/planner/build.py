"""build_plan: model + training settings + policy -> Plan (tasks, edges, lane orders, buffers).

The GPU runs, per micro-batch: embedding forward, layer forwards 0..L-1, the head (final norm,
LM head and loss, forward and backward), layer backwards L-1..0 (each recomputes its forward
from its checkpointed input), embedding backward. A sweep runs that sequence for one
micro-batch (step-major accumulation) or for all of a step's, each task for every micro-batch
in turn while the block's weights stay loaded (layer-major). Everything else is arranged around
that sequence: weight loads into a ring of `window` cache units, checkpoint offload and prefetch,
gradient offload, and per block the CPU optimizer step and fp32->bf16 cast, with optimizer
state streamed from NVMe where the policy puts it there. Several consecutive steps are planned
so that one step's optimizer tail and the next step's forward overlap as they will for real.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from itertools import accumulate, pairwise

import networkx as nx

from layerslide.kinds import STREAM_LANES, Lane, TaskKind
from layerslide.planner import sizes
from layerslide.planner.model import BF16_BYTES, FP32_BYTES, ModelSpec
from layerslide.planner.plan import (
    DEDICATED,
    EMBEDDING,
    GPU_RESIDENT_LAYERS,
    GPU_UPDATED_STATE,
    GPU_WEIGHT_UNITS,
    HOST_CHECKPOINTS,
    HOST_GRAD_ACCUM,
    HOST_GRAD_LANDING,
    HOST_MASTER,
    HOST_MOMENTS,
    HOST_UPLOAD,
    LANES,
    MIN_STEPS,
    NO_SLOT,
    NVME_MASTER,
    NVME_MOMENTS,
    NVME_WEIGHTS,
    STEADY_STEPS,
    Buffer,
    Placement,
    Plan,
    Task,
    block_name,
    block_weights_buffer_id,
    policy_placement,
    runtime_buffer_id,
    task_buffer_id,
    task_id,
)
from layerslide.planner.settings import (
    Policy,
    TrainSpec,
    disk_cut,
    grads_land_in_upload,
    landing_buffers,
    moments_nbytes,
    sums_grads_on_host,
    sweep_group_sizes,
)
from layerslide.planner.sharding import Shards

K = TaskKind


def build_plan(model: ModelSpec, train: TrainSpec, policy: Policy, *,
               num_steps: int = STEADY_STEPS, validate: bool = True) -> Plan:
    """Plan `num_steps` consecutive training steps (at least MIN_STEPS). validate=False leaves
    Plan.validate out (a search's plans, a sixth of each build: tests/tuner check the plans a
    search builds, and tune validates its pick)."""
    if num_steps < MIN_STEPS:
        raise ValueError(f"num_steps={num_steps}: plan at least {MIN_STEPS} steps so that one "
                         "step's optimizer tail meets the next step's forward")
    if train.seq_len > model.max_position_embeddings:
        raise ValueError(f"seq_len={train.seq_len} exceeds {model.name}'s "
                         f"max_position_embeddings={model.max_position_embeddings}")
    if train.ranks > 1 and policy.residency.gpu_updated_blocks:
        raise ValueError(f"gpu_updated_blocks={policy.residency.gpu_updated_blocks} with "
                         f"{train.ranks} ranks: blocks updated on the GPU are planned for one "
                         "rank only; set gpu_updated_blocks=0")
    return _Builder(model, train, policy, num_steps).build(validate)


def static_buffers(model: ModelSpec, train: TrainSpec, policy: Policy) -> tuple[Buffer, ...]:
    """The static buffers build_plan's plan would have, without building its tasks: what a
    search checks against the memory limits before it builds a plan of thousands of tasks."""
    builder = _Builder(model, train, policy, MIN_STEPS)
    builder.static_buffers()
    return tuple(builder.buffers)


_TASK_FIELDS = frozenset(f.name for f in fields(Task))
_TASK_DEFAULTS = {f.name: f.default for f in fields(Task) if f.default is not MISSING}
_TASK_REQUIRED = _TASK_FIELDS - _TASK_DEFAULTS.keys() - {"id"}  # the id: _new_task's own
_BUFFER_FIELDS = frozenset(f.name for f in fields(Buffer))


def _replaced(task: Task, changes: dict) -> Task:
    """dataclasses.replace(task, **changes) without its per-field work (a tenth of a build):
    Task has no __post_init__, so a copy of its fields is the same task."""
    assert changes.keys() <= _TASK_FIELDS, changes.keys() - _TASK_FIELDS
    new = object.__new__(Task)
    vars(new).update(vars(task), **changes)
    return new


def _new_task(fields: dict, tid: str, priority: tuple[int, int]) -> Task:
    """Task(id=tid, priority=priority, **fields) without the frozen dataclass's setattr per
    field (a build makes ~10k tasks; this takes a third of the time): Task has no
    __post_init__, so its fields are the task."""
    assert _TASK_REQUIRED <= fields.keys() <= _TASK_FIELDS, fields.keys() ^ _TASK_FIELDS
    new = object.__new__(Task)
    state = vars(new)
    state.update(_TASK_DEFAULTS)
    state.update(fields)
    state["id"], state["priority"] = tid, priority
    return new


def _new_buffer(**values) -> Buffer:
    """Buffer(**values) given every field, likewise without its setattr per field."""
    assert values.keys() == _BUFFER_FIELDS, values.keys() ^ _BUFFER_FIELDS
    new = object.__new__(Buffer)
    vars(new).update(values)
    return new


def gpu_update_candidates(num_layers: int, order: str) -> list[int]:
    """Blocks in the order gpu_updated_blocks takes them (Policy.gpu_updated_order)."""
    if order == "layers_first":
        return [*range(num_layers), num_layers, EMBEDDING]
    return [EMBEDDING, *range(num_layers), num_layers]


def build_repeatable_plan(model: ModelSpec, train: TrainSpec, policy: Policy) -> Plan:
    """A plan whose last step Plan.unroll can repeat: STEADY_STEPS, or more where a pool of
    slots is reused across more steps than that (the last step must have every dependency)."""
    plan = build_plan(model, train, policy)
    if plan.reach_steps() < plan.num_steps:
        return plan
    return build_plan(model, train, policy, num_steps=plan.reach_steps() + 1)


@dataclass(frozen=True, kw_only=True)
class GpuLayout:
    """Which blocks stay on the GPU and how many cache units the other layers slide through."""

    gpu_updated: tuple[int, ...]  # updated on the GPU, in the order the next forward needs them
    dedicated_layers: tuple[int, ...]  # decoder layers with a unit of their own (never slide)
    ring_units: int  # units the sliding layers share


def gpu_layout(num_layers: int, policy: Policy) -> GpuLayout:
    """The policy's GPU layout for a model of num_layers decoder layers."""
    taken = gpu_update_candidates(num_layers, policy.residency.gpu_updated_order)
    # updated in the order the next forward needs them, whichever were taken
    gpu_updated = tuple(sorted(taken[:policy.residency.gpu_updated_blocks]))
    dedicated = sorted({*range(min(policy.residency.resident_layers, num_layers)),
                        *(b for b in gpu_updated if 0 <= b < num_layers)})
    return GpuLayout(gpu_updated=gpu_updated, dedicated_layers=tuple(dedicated),
                     ring_units=min(policy.residency.window, num_layers - len(dedicated)))


@dataclass
class _Slot:
    """A GPU weight buffer: which (layer, version) it holds and its last reader."""

    content: tuple[int, int] | None = None
    last_use: str | None = None
    last_pos: int = -1


class _Builder:
    def __init__(self, model: ModelSpec, train: TrainSpec, policy: Policy, num_steps: int):
        self.model, self.train, self.policy, self.num_steps = model, train, policy, num_steps
        self.L = model.num_layers
        self.A = train.grad_accum
        # a sweep runs its Q groups of micro-batches through each task in turn: a sweep per
        # micro-batch, each one group of one (step-major), or one sweep of all the step's
        # micro-batches in up to sweep_groups groups (layer-major)
        sizes = sweep_group_sizes(policy, train)
        self.Q, self.sweep_size = len(sizes), sum(sizes)  # groups, micro-batches of a sweep
        starts = [0, *accumulate(sizes)][:-1]  # of each group within its sweep
        self.groups = [(sweep * self.sweep_size + start, size)  # (first micro-batch, count)
                       for sweep in range(self.A // self.sweep_size)
                       for start, size in zip(starts, sizes, strict=True)]
        self.group_of = {m: g for g, (first, size) in enumerate(self.groups)
                         for m in range(first, first + size)}
        self.host_sums = sums_grads_on_host(policy, train)
        self.tokens = train.tokens_per_micro_batch
        self.graph = nx.DiGraph()
        self.worker_tasks: list[str] = []  # tasks of the copy and worker lanes, as added
        self.gpu_order: list[str] = []
        self.buffers: list[Buffer] = []
        self.layout = layout = gpu_layout(self.L, policy)
        self.gpu_updated = list(layout.gpu_updated)
        self.gpu_grad_producer: dict[tuple[int, int], str] = {}
        self.resident = {EMBEDDING, self.L, *layout.dedicated_layers, *self.gpu_updated}
        self.slots = [_Slot() for _ in range(layout.ring_units)]
        self.resident_slots = {b: _Slot() for b in self.resident}
        self.grad_slots = [None] * policy.residency.grad_buffers  # the last offload of each
        self.grad_slot_next = 0
        self.dedicated_grad_last: dict[int, str | None] = {EMBEDDING: None, self.L: None}
        # blocks whose grads are offloaded (those updated on the GPU never are): with one
        # landing buffer each, an offload reuses its block's buffer from the previous micro-batch
        blocks = self.L + 2 - len(self.gpu_updated)
        pool = blocks
        self.land_in_upload = grads_land_in_upload(policy, train)
        wanted = landing_buffers(policy)
        if train.max_grad_norm is None and wanted is not None and not self.land_in_upload:
            pool = min(wanted, blocks)
        self.host_grad_consumers: list[str] = []  # consumer of each offload, in d2h order
        self.host_grad_pool = pool
        self.grad_landing = ("upload" if self.land_in_upload
                             else "pool" if pool < blocks else "per_block")
        self.state_chain: list[tuple[str, str]] = []  # (read_state, write_state) in issue order
        self.state_slots: dict[str, int] = {}  # write_state -> the staging slot it frees
        self.landing_slots: dict[tuple[int, int, int], int] = {}  # (step, micro, block) -> slot
        self.step_markers: list[str] = []
        self.cast_lane = Lane.CPU_CAST if policy.schedule.cast_worker else Lane.CPU
        # the first round(fraction * n) of each CPU-updated block's master weights and moments
        # live on NVMe (GPU-updated blocks keep theirs whole); 8-bit moments cut at scale blocks
        where = policy.residency
        self.moments = where.moment_precision
        # a host's ranks each own a slice of every block's host state (planner/sharding.py)
        self.shards = {b: Shards(model.block_params(b), train.gpus)
                       for b in (EMBEDDING, *range(self.L), self.L)}

        def cut(b: int, fraction: float) -> int:
            return 0 if b in self.gpu_updated else disk_cut(self.host_params(b), fraction,
                                                            self.moments)

        self.disk = {b: (cut(b, where.master_on_nvme), cut(b, where.moments_on_nvme))
                     for b in (EMBEDDING, *range(self.L), self.L)}
        # and the first round(fraction * n) of its bf16 weights: each load reads them from NVMe
        # into one of weight_staging_slots host buffers, taken in turn
        self.disk_weights = {b: cut(b, where.weights_on_nvme) for b in self.disk}
        self.weight_staging_slots = (policy.schedule.prefetch_depth + 1
                                     if any(self.disk_weights.values()) else 0)
        self.weight_loads: list[str] = []  # loads that read weights from NVMe, in issue order

    # --- small helpers ---------------------------------------------------------------------
    def tid(self, kind: TaskKind, block: int, step: int, micro: int = 0,
            for_kind: str = "") -> str:
        return task_id(kind=kind, block=block, step=step, micro_batch=micro, num_layers=self.L,
                       for_kind=for_kind)

    def add(self, key: tuple[int, int] | None = None, **fields) -> str:
        """Add a task, its id from task_id(). key: its priority on a copy or worker lane (the
        GPU position it serves); a GPU task's is its own position in the GPU sequence."""
        tid = self.tid(fields["kind"], fields["block"], fields["step"],
                       fields.get("micro_batch", 0), fields.get("for_kind", ""))
        # an edge may name a task before it is added (a later step's consumer): not twice, though
        assert "task" not in self.graph._node.get(tid, ()), tid
        if fields["lane"] == Lane.GPU:
            key = (len(self.gpu_order), 0)
            self.gpu_order.append(tid)
        else:
            assert key is not None, tid
            self.worker_tasks.append(tid)
        task, graph = _new_task(fields, tid, key), self.graph
        if tid in graph._node:  # named by an edge before it was added
            graph._node[tid]["task"] = task
        else:  # DiGraph.add_node's dicts, without its call per task
            graph._succ[tid], graph._pred[tid], graph._node[tid] = {}, {}, {"task": task}
        return tid

    def task_of(self, tid: str) -> Task:
        return self.graph._node[tid]["task"]  # not through the NodeView: a build reads 100k

    def update_task(self, tid: str, **changes) -> None:
        self.graph._node[tid]["task"] = _replaced(self.task_of(tid), changes)

    def edge(self, src: str | None, dst: str, reason: str) -> None:
        if src is None:
            return
        succ, pred = self.graph._succ, self.graph._pred
        if src not in succ or dst not in succ:  # a task not added yet: networkx adds its node
            self.graph.add_edge(src, dst, reason=reason)
            return
        # DiGraph.add_edge's dicts, without its call per edge (a build adds ~20k): one data
        # dict shared by both ends, its "reason" the latest given
        data = succ[src].get(dst)
        if data is None:
            data = succ[src][dst] = pred[dst][src] = {}
        data["reason"] = reason

    def buffer(self, owner: str | None, name: str, tier: str, nbytes: float,
               release: tuple[str, ...] = (), at_end: bool = False,
               outlives_outputs: bool = False) -> None:
        """A buffer `owner` allocates (named after it), or a static one (owner None)."""
        if nbytes > 0:
            bid = name if owner is None else task_buffer_id(owner, name)
            self.buffers.append(_new_buffer(id=bid, tier=tier, bytes=int(nbytes),
                                            alloc_task=owner, release_tasks=release,
                                            at_end=at_end, outlives_outputs=outlives_outputs,
                                            name=name))

    def params(self, block: int) -> int:
        return self.model.block_params(block)

    def host_params(self, block: int) -> int:
        """Elements of the block's host state this rank owns: its slice (all of it alone)."""
        return self.shards[block].slice_numel

    def gpu_params(self, block: int) -> int:
        """Elements of the block's flat GPU weights: its slices together."""
        return self.shards[block].padded_numel

    def blk(self, block: int) -> str:
        return block_name(block, self.L)

    # --- positions in the GPU sequence (known in advance: used as priorities) ---------------
    @property
    def per_micro(self) -> int:
        return 2 * self.L + 3

    @property
    def per_step(self) -> int:
        """GPU tasks per step: the groups of micro-batches, then the GPU-updated blocks'
        optimizer steps."""
        return len(self.groups) * self.per_micro + len(self.gpu_updated)

    def pos(self, step: int, micro: int, phase: str, block: int) -> int:
        """Position in the GPU sequence of the task running micro-batch `micro`: a sweep runs
        each of its per_micro tasks for its Q groups in turn."""
        if phase == "fwd":
            index = 0 if block == EMBEDDING else 1 + block
        elif phase == "head":
            index = self.L + 1
        else:
            index = 2 * self.L + 2 if block == EMBEDDING else self.L + 2 + (self.L - 1 - block)
        sweep, within = divmod(self.group_of[micro], self.Q)
        return step * self.per_step + sweep * self.Q * self.per_micro + index * self.Q + within

    def load_gate(self, pos: int, ahead: int) -> str | None:
        """The GPU task after which a load for the task at `pos` may start, `ahead` blocks of
        the sequence ahead of it (a block's run of Q tasks counts as one: its first group's
        task is where the load is needed)."""
        within = self.group_of[self.task_of(self.gpu_order[pos]).micro_batch] % self.Q
        return self.gpu_at(pos - within - ahead * self.Q - 1)

    def first_use_pos(self, step: int, block: int) -> int:
        return self.pos(step, 0, "head" if block == self.L else "fwd", block)

    def grad_pos(self, step: int, micro: int, block: int) -> int:
        return self.pos(step, micro, "head" if block == self.L else "bwd", block)

    def gpu_at(self, pos: int) -> str | None:
        return self.gpu_order[pos] if 0 <= pos < len(self.gpu_order) else None

    # --- weights ------------------------------------------------------------------------------
    def weights_ready(self, block: int, step: int) -> str | None:
        """The task after which version `step` of the block's weights may be loaded."""
        if step == 0:
            return None
        if self.policy.schedule.cast == "cpu_once" and not self.policy.optimizer_casts:
            return self.tid(K.CAST, block, step - 1)
        return self.tid(K.OPTIMIZER_STEP, block, step - 1)

    def ensure_weights(self, block: int, step: int, micro: int, consumer: str, pos: int) -> None:
        """Make block weights (version `step`) present for `consumer`, loading them if needed."""
        assert self.gpu_order[pos] == consumer, (pos, consumer)  # priorities are GPU positions
        if block in self.gpu_updated:  # never leaves the GPU: wait for its last update there
            slot = self.resident_slots[block]
            if slot.content != (block, step) and step > 0:
                self.edge(self.tid(K.OPTIMIZER_STEP, block, step - 1), consumer, "weights")
            slot.content = (block, step)
            return
        if block in self.resident:
            slot = self.resident_slots[block]
        else:
            slot = next((s for s in self.slots if s.content == (block, step)), None)
            if slot is None:
                slot = min(self.slots, key=lambda s: s.last_pos)  # least recently used unit
        unit = DEDICATED if block in self.resident else self.slots.index(slot)
        if unit != DEDICATED:
            self.update_task(consumer, unit=unit)
        depth = self.policy.schedule.prefetch_depth
        if slot.content != (block, step):
            p = self.host_params(block)
            wire = FP32_BYTES if self.policy.schedule.cast == "gpu" else BF16_BYTES
            for_kind = self.task_of(consumer).kind
            load = self.add(kind=K.LOAD_WEIGHTS, lane=Lane.H2D, block=block, step=step,
                            micro_batch=micro, for_kind=for_kind, bytes=wire * p, params=p,
                            unit=unit, key=(pos, 0))
            self.edge(slot.last_use, load, "unit_reuse")
            if block not in self.resident:
                self.edge(self.load_gate(pos, depth), load, "prefetch")
            if self.policy.schedule.cast == "cpu_per_load":
                cast = self.add(kind=K.CAST, lane=self.cast_lane, block=block, step=step,
                                micro_batch=micro, for_kind=for_kind, bytes=FP32_BYTES * p,
                                params=p, key=(pos - depth - 1, 0))
                if step > 0:
                    self.edge(self.tid(K.OPTIMIZER_STEP, block, step - 1), cast, "weights")
                self.edge(self.load_gate(pos, depth + 1), cast, "prefetch")
                self.edge(cast, load, "data")
                self.buffer(cast, "staging", "host", BF16_BYTES * p, (load,))
            else:
                self.edge(self.weights_ready(block, step), load, "weights")
            if self.disk_weights[block]:
                self.read_weights(load, pos, depth)
            if self.policy.schedule.cast == "gpu":  # the consumer first casts the fp32 it was sent
                task, gp = self.task_of(consumer), self.gpu_params(block)
                self.update_task(consumer, bytes=task.bytes + (FP32_BYTES + BF16_BYTES) * gp,
                                 host_ops=task.host_ops + 1, casts_weights=True)
            self.edge(self.gather(load, wire, pos), consumer, "weights")
            slot.content = (block, step)
        slot.last_use, slot.last_pos = consumer, pos

    def gather(self, load: str, wire_bytes: int, pos: int) -> str:
        """The other ranks' slices of what `load` sent, all-gathered into its unit: the task
        after which the unit holds the whole block (the load itself on one rank)."""
        if self.train.gpus == 1:
            return load
        task = self.task_of(load)
        gather = self.add(kind=K.GATHER_WEIGHTS, lane=Lane.GATHER, block=task.block,
                          step=task.step, micro_batch=task.micro_batch, for_kind=task.for_kind,
                          bytes=wire_bytes * self.gpu_params(task.block), unit=task.unit,
                          comm_group="host", key=(pos, 0))
        self.edge(load, gather, "data")
        return gather

    def read_weights(self, load: str, pos: int, depth: int) -> None:
        """Before a load, read the block's bf16 weights on NVMe (those its last update wrote)
        into the next staging slot, free once the load that last took it has ended."""
        task, slots = self.task_of(load), self.weight_staging_slots
        nbytes = BF16_BYTES * self.disk_weights[task.block]
        slot = len(self.weight_loads) % slots
        read = self.add(kind=K.READ_WEIGHTS, lane=Lane.NVME_READ, block=task.block,
                        step=task.step, micro_batch=task.micro_batch, for_kind=task.for_kind,
                        bytes=nbytes, params=self.disk_weights[task.block], slot=slot,
                        key=(pos, 0))
        self.update_task(load, slot=slot)
        if len(self.weight_loads) >= slots:
            self.edge(self.weight_loads[-slots], read, "unit_reuse")
        self.edge(self.load_gate(pos, depth + 1), read, "prefetch")
        if task.step > 0:
            self.edge(self.tid(K.WRITE_STATE, task.block, task.step - 1), read, "data")
        self.edge(read, load, "data")
        self.buffer(read, "weight_staging", "host", nbytes, (load,))
        self.weight_loads.append(load)

    # --- the GPU sequence of one micro-batch ----------------------------------------------------
    def compute(self, step: int, micro: int, kind: TaskKind, block: int, flops: float = 0.0,
                nbytes: float = 0.0, host_ops: int = 0, attention_flops: float = 0.0) -> str:
        """A GPU task of the group starting at micro-batch `micro`: its amounts are per
        micro-batch, times the group's."""
        n = self.count(micro)
        return self.add(kind=kind, lane=Lane.GPU, block=block, step=step, micro_batch=micro,
                        micro_batches=n, flops=n * flops, attention_flops=n * attention_flops,
                        bytes=n * nbytes, tokens=self.tokens, host_ops=n * host_ops)

    def sweep_firsts(self, micro: int) -> list[int]:
        """The first micro-batch of each group of the sweep that runs `micro`."""
        start = self.group_of[micro] - self.group_of[micro] % self.Q
        return [first for first, _ in self.groups[start:start + self.Q]]

    def count(self, micro: int) -> int:
        """Micro-batches in the group that starts at `micro`."""
        return self.groups[self.group_of[micro]][1]

    def sweep(self, s: int, micros: list[int]) -> None:
        """The GPU sequence of one sweep of step s: each task runs for each of its groups (by
        their first micro-batches, `micros`) in turn, and a group's task for each of the
        group's micro-batches (one micro-batch: step-major; all of the step's: layer-major)."""
        # (tasks follow each other on the strict GPU lane: no edge between micro-batches needed)
        producers, fwd = self._forwards(s, micros)
        heads = self._heads(s, micros, producers)
        bwd, emb_bwd = self._backwards(s, micros, producers, fwd, heads)
        for m in micros:
            self.grads(s, m, self.L, heads[m])
        for i in reversed(range(self.L)):
            for m in micros:
                self.grads(s, m, i, bwd[(i, m)])
        for m in micros:
            self.grads(s, m, EMBEDDING, emb_bwd[m])
        kernels = self.policy.kernels
        for m in micros:
            self.buffer(heads[m], "workspace", "gpu",
                        sizes.head_loss_workspace_bytes(self.model, self.tokens, kernels.head_loss,
                                                        kernels.head_chunk_bytes),
                        (heads[m],))

    def _layer_amounts(self) -> tuple[int, int, int]:
        """A decoder layer's forward on one micro-batch: elementwise bytes, GEMM and attention
        FLOPs."""
        model, T = self.model, self.tokens
        ew = sizes.layer_elementwise_bytes_per_token(model, self.policy.kernels.layer_kernels) * T
        return (ew, sizes.layer_matmul_flops_per_token(model) * T,
                sizes.attention_flops_per_token(model, self.train.seq_len) * T)

    def _forwards(self, s: int, micros: list[int]):
        """The embedding's and each layer's forward; by (layer, micro): the maker of that
        layer's checkpointed input (`producers`, L: the head's) and the layer's forward."""
        hidden = sizes.hidden_bytes(self.model, self.tokens)
        ew, gemm_flops, attn_flops = self._layer_amounts()
        producers: dict[tuple[int, int], str] = {}
        for m in micros:
            emb = self.compute(s, m, K.FORWARD, EMBEDDING, nbytes=2 * hidden, host_ops=2)
            self.ensure_weights(EMBEDDING, s, m, emb, self.pos(s, m, "fwd", EMBEDDING))
            producers[(0, m)] = emb
        fwd: dict[tuple[int, int], str] = {}
        for i in range(self.L):
            for m in micros:
                t = self.compute(s, m, K.FORWARD, i, flops=gemm_flops, attention_flops=attn_flops,
                                 nbytes=ew, host_ops=sizes.LAYER_FORWARD_OPS)
                self.edge(producers[(i, m)], t, "data")
                self.ensure_weights(i, s, m, t, self.pos(s, m, "fwd", i))
                self.buffer(t, "workspace", "gpu",
                            sizes.forward_workspace_bytes(self.model, self.tokens), (t,))
                fwd[(i, m)] = producers[(i + 1, m)] = t
        return producers, fwd

    def _heads(self, s: int, micros: list[int], producers) -> dict[int, str]:
        """The head (final norm, LM head, loss and its backward) of each group."""
        model, T, L = self.model, self.tokens, self.L
        hidden = sizes.hidden_bytes(model, T)
        heads: dict[int, str] = {}
        for m in micros:
            head = self.compute(s, m, K.HEAD, L,
                                flops=3 * model.head_forward_flops_per_token * T,
                                nbytes=4 * hidden + sizes.head_logit_bytes(
                                    model, T, self.policy.kernels.head_loss),
                                host_ops=sizes.HEAD_OPS)
            self.edge(producers[(L, m)], head, "data")
            self.ensure_weights(L, s, m, head, self.pos(s, m, "head", L))
            # its requests in their order: the final norm's saved tensors, the LM weight's grad
            # (grads() below) and then the loss's logits (H200 allocator histories: the tied grad
            # goes on top of the forward's blocks, the logits chunk above it)
            # the norm's bf16 output is held by the head's call until it returns, past the
            # grads it keeps (outputs). Its fp32 saved tensors go as its backward ends: after
            # the dgrad that backward makes, before a layer-major head's sums. A task's outputs
            # come at once here, so a step-major head (its one output: that dgrad) holds them
            # past its outputs, and a layer-major one does not
            normed = sizes.hidden_bytes(model, T)
            self.buffer(head, "norm", "gpu", sizes.final_norm_saved_bytes(model, T) - normed,
                        (head,), outlives_outputs=self.sweep_size == 1)
            self.buffer(head, "normed", "gpu", normed, (head,), outlives_outputs=True)
            # the final hidden state lives from the last forward until the head has consumed it
            self.buffer(producers[(L, m)], "final_hidden", "gpu", hidden * self.count(m),
                        (head,), at_end=self.count(m) == 1)
            heads[m] = head
        return heads

    def _backwards(self, s: int, micros: list[int], producers, fwd, heads):
        """Each layer's backward (its forward recomputed from its checkpoint) and the
        embedding's, the gradient flowing from the head down through them."""
        hidden = sizes.hidden_bytes(self.model, self.tokens)
        ew, gemm_flops, attn_flops = self._layer_amounts()
        bwd: dict[tuple[int, int], str] = {}
        for i in reversed(range(self.L)):
            for m in micros:
                # recompute the forward, then backward (GEMMs and elementwise traffic twice the
                # forward's)
                bwd[(i, m)] = self.compute(s, m, K.BACKWARD, i, flops=3 * gemm_flops,
                                           attention_flops=attn_flops, nbytes=3 * ew,
                                           host_ops=sizes.LAYER_BACKWARD_OPS)
        emb_bwd = {m: self.compute(s, m, K.BACKWARD, EMBEDDING, nbytes=2 * hidden, host_ops=2)
                   for m in micros}
        for m in micros:  # the gradient: made by the head and each backward, read by the next
            flow_users = [heads[m], *(bwd[(i, m)] for i in reversed(range(self.L))), emb_bwd[m]]
            for maker, reader in pairwise(flow_users):
                self.edge(maker, reader, "data")
                self.buffer(maker, "dgrad", "gpu", hidden * self.count(m), (reader,),
                            at_end=self.count(m) == 1)
        workspace = sizes.backward_workspace_bytes(self.model, self.tokens,
                                                   self.policy.kernels.layer_kernels)
        for i in reversed(range(self.L)):
            for m in micros:
                t = bwd[(i, m)]
                pos = self.pos(s, m, "bwd", i)
                self.ensure_weights(i, s, m, t, pos)
                self.buffer(t, "workspace", "gpu", workspace, (t,))
                self.checkpoint(s, m, i, producers[(i, m)], fwd[(i, m)], t, pos)
        return bwd, emb_bwd

    def checkpoint(self, s: int, m: int, i: int, producer: str, consumer_fwd: str,
                   consumer_bwd: str, bwd_pos: int) -> None:
        """The input of layer i: kept on the GPU, or offloaded after forward and fetched back."""
        pol, n = self.policy, self.count(m)
        nbytes = n * sizes.hidden_bytes(self.model, self.tokens)  # the group's checkpoints
        # a group's outputs come one by one while its task runs: counted from its start
        if pol.residency.activations == "gpu":
            self.buffer(producer, "checkpoint", "gpu", nbytes, (consumer_fwd, consumer_bwd),
                        at_end=n == 1)
            return
        producer_pos = self.pos(s, m, "fwd", i - 1 if i > 0 else EMBEDDING)
        common = {"block": i, "step": s, "micro_batch": m, "micro_batches": n, "bytes": nbytes}
        off = self.add(kind=K.OFFLOAD_ACTIVATION, lane=Lane.D2H, **common, key=(producer_pos, 0))
        self.edge(producer, off, "data")
        self.buffer(producer, "checkpoint", "gpu", nbytes, (consumer_fwd, off), at_end=n == 1)
        fetch = self.add(kind=K.FETCH_ACTIVATION, lane=Lane.H2D, **common, key=(bwd_pos, 1))
        self.edge(self.gpu_at(bwd_pos - pol.schedule.prefetch_depth - 1), fetch, "prefetch")
        if pol.residency.activations == "host":  # its pinned buffer: host.checkpoints (static)
            self.edge(off, fetch, "data")
        else:
            write = self.add(kind=K.WRITE_ACTIVATION, lane=Lane.NVME_WRITE, **common,
                             key=(producer_pos, 0))
            read = self.add(kind=K.READ_ACTIVATION, lane=Lane.NVME_READ, **common,
                            key=(bwd_pos - pol.schedule.prefetch_depth - 1, 1))
            self.edge(off, write, "data")
            self.edge(write, read, "data")
            self.edge(self.gpu_at(bwd_pos - pol.schedule.prefetch_depth - 2), read, "prefetch")
            self.edge(read, fetch, "data")
            self.buffer(off, "host", "host", nbytes, (write,))
            self.buffer(write, "file", "nvme", nbytes, (read,))
            self.buffer(read, "staging", "host", nbytes, (fetch,))
        self.buffer(fetch, "fetched", "gpu", nbytes, (consumer_bwd,))
        self.edge(fetch, consumer_bwd, "data")

    def grads(self, s: int, m: int, block: int, producer: str) -> None:
        """Offload the block's bf16 grads to the host (after a sweep of several micro-batches,
        their sum), and accumulate them there under step-major accumulation."""
        p = self.params(block)
        tied = block == EMBEDDING and self.model.tie_word_embeddings
        if tied:
            # the embedding backward adds its rows into the head's LM-weight grad in place (a
            # second [V, h] grad doubled the peak): that tensor, made by the head, is the
            # embedding's grads from then on; the rows, summed per token id, are its workspace
            rows = min(self.tokens, self.model.vocab_size) * self.model.hidden_size
            self.buffer(producer, "rows", "gpu", BF16_BYTES * rows, (producer,))
        if block in self.gpu_updated:  # fp32 grads accumulate on the GPU, in place
            self.gpu_grad_producer[(s, block)] = producer
            if tied:  # the head adds it into the sum itself when a sweep has several
                head = self.tid(K.HEAD, self.L, s, m)
                self.tied_grad(s, m, release=producer if self.sweep_size == 1 else head)
            else:  # autograd's fresh bf16 grad, added into the fp32 sum within the task
                self.buffer(producer, "grads", "gpu", BF16_BYTES * p, (producer,))
            return
        if self.sweep_size > 1 and not self.add_to_gpu_sum(s, m, block, producer):
            return  # not the sweep's last micro-batch: nothing crosses to the host yet
        pos = self.grad_pos(s, m, block)
        # the pool's buffers are taken in d2h order; the offload, and the task that reads the
        # landed grads, name the one they use
        landing = len(self.host_grad_consumers) % self.host_grad_pool
        landing = landing if self.grad_landing == "pool" else NO_SLOT
        self.landing_slots[(s, m, block)] = landing
        hp = self.host_params(block)
        off = self.add(kind=K.OFFLOAD_GRADS, lane=Lane.D2H, block=block, step=s, micro_batch=m,
                       bytes=BF16_BYTES * hp, params=hp, slot=landing, key=(pos, 1))
        self.edge(self.reduce_grads(s, m, block, producer, off), off, "data")
        if self.sweep_size > 1:  # the sum rounded to bf16 by the sweep's last task, to offload:
            # made once its scratch (autograd's grads, the workspace) is gone, beside the fp32
            # sum (an input, or scratch outliving the outputs: simulator.memory; allocator
            # histories in benchmarks/results/scoreboard_2026-12-04d)
            self.buffer(producer, "offloaded_grads", "gpu", BF16_BYTES * p, (off,), at_end=True)
        if block in self.dedicated_grad_last and self.sweep_size > 1:
            # the next sum of these grads is made only once this one is offloaded
            self.edge(self.dedicated_grad_last[block], self.sum_maker(s, m, block, producer),
                      "unit_reuse")
            self.dedicated_grad_last[block] = off
        elif block in self.dedicated_grad_last:
            # autograd makes these grads afresh in each backward; the caching allocator takes
            # them back once offloaded (H200: a 1B model's peak is at its embedding backward,
            # tied LM-head grad + embedding grad both alive, not a standing grad buffer)
            if tied:
                self.tied_grad(s, m, release=off)
            else:  # an untied LM head's weight grad sums over the loss's chunks: from the start
                self.buffer(producer, "offloaded_grads", "gpu", BF16_BYTES * p, (off,),
                            at_end=block != self.L)
            self.edge(self.dedicated_grad_last[block], producer, "unit_reuse")
            if block == EMBEDDING and self.model.tie_word_embeddings:
                # the head makes the tied LM-head grad the embedding backward adds in: it waits
                # as that backward does, so one embedding-sized grad of a kind is alive at once
                self.edge(self.dedicated_grad_last[block], self.tid(K.HEAD, self.L, s, m),
                          "unit_reuse")
            self.dedicated_grad_last[block] = off
        else:
            # autograd makes a layer's grads afresh too; at most grad_buffers layers' grads are
            # alive at once (a backward waits for the offload grad_buffers layers before it)
            if self.sweep_size == 1:
                self.buffer(producer, "offloaded_grads", "gpu", BF16_BYTES * p, (off,),
                            at_end=True)
            slot = self.grad_slot_next % len(self.grad_slots)
            self.edge(self.grad_slots[slot], producer, "unit_reuse")
            self.grad_slots[slot] = off
            self.grad_slot_next += 1
            self.update_task(producer, slot=slot)
        if not self.host_sums:
            consumer = self.tid(K.OPTIMIZER_STEP, block, s)
        else:
            consumer = self.add(kind=K.ACCUMULATE_GRADS, lane=Lane.CPU, block=block, step=s,
                                micro_batch=m, bytes=sizes.ACCUMULATE_BYTES_PER_PARAM * hp,
                                params=hp, slot=landing, key=(pos, 2))
            self.edge(off, consumer, "data")
            if m > 0:
                self.edge(self.tid(K.ACCUMULATE_GRADS, block, s, m - 1), consumer, "data")
        # it lands in a pinned buffer of host.grad_landing (static_buffers)
        # backpressure: the offload waits for a free pinned landing buffer
        if len(self.host_grad_consumers) >= self.host_grad_pool:
            self.edge(self.host_grad_consumers[-self.host_grad_pool], off, "unit_reuse")
        self.host_grad_consumers.append(consumer)

    def reduce_grads(self, s: int, m: int, block: int, producer: str, off: str) -> str:
        """The block's bf16 grads that `producer` made, summed over the ranks into this rank's
        slice (reduce-scattered over the host's ranks, then all-reduced with the same slice's
        owners on the other hosts): the task after which `off` may copy the slice down."""
        pos, ready = self.grad_pos(s, m, block), producer
        common = {"block": block, "step": s, "micro_batch": m, "params": self.host_params(block)}
        if self.train.gpus > 1:
            ready = self.add(kind=K.REDUCE_GRADS, lane=Lane.REDUCE, **common,
                             bytes=BF16_BYTES * self.gpu_params(block), comm_group="host",
                             key=(pos, 0))
            self.edge(producer, ready, "data")
            if self.sweep_size == 1:  # autograd's grads, a tensor per parameter, copied into
                # one flat buffer padded to the slices, as the collective takes them
                self.buffer(ready, "flat_grads", "gpu", BF16_BYTES * self.gpu_params(block),
                            (ready,))
            self.buffer(ready, "reduced", "gpu", BF16_BYTES * self.host_params(block), (off,))
        if self.train.hosts > 1:
            peers = self.add(kind=K.ALL_REDUCE_GRADS, lane=Lane.REDUCE, **common,
                             bytes=BF16_BYTES * self.host_params(block), comm_group="peers",
                             key=(pos, 1))
            self.edge(ready, peers, "data")
            ready = peers
        return ready

    def sum_maker(self, s: int, m: int, block: int, producer: str) -> str:
        """The task that makes the sweep's fp32 grad sum of the block: its first micro-batch's
        producer (a tied embedding's: the head, whose LM-weight grad it starts from)."""
        first = self.sweep_firsts(m)[0]
        if block == EMBEDDING and self.model.tie_word_embeddings:
            return self.tid(K.HEAD, self.L, s, first)
        return self.tid(self.task_of(producer).kind, block, s, first)

    def add_to_gpu_sum(self, s: int, m: int, block: int, producer: str) -> bool:
        """A sweep of several micro-batches sums the block's grads in fp32 on the GPU: the
        first group's task makes the sum, each task adds its micro-batches' grads, the last
        rounds it to bf16 for the offload. Returns whether `producer` is that last one."""
        p, within = self.params(block), self.group_of[m] % self.Q
        last = self.tid(self.task_of(producer).kind, block, s, self.sweep_firsts(m)[-1])
        tied = block == EMBEDDING and self.model.tie_word_embeddings
        adder = self.tid(K.HEAD, self.L, s, m) if tied else producer
        # a decoder layer's projection grads go into the sum from their GEMMs (grad_into_sum)
        into = self.model.layer_matmul_params if 0 <= block < self.L else 0
        maker = self.sum_maker(s, m, block, producer)
        # the head's and embedding's sums (a tied one made by the head) are copied from the
        # first micro-batch's grad once autograd has made it (gpu_updates.add_into_sum): each
        # comes as a task of one micro-batch ends, beside that grad. A decoder layer's is made
        # before its backward (grad_into_sum), and a task of several makes more grads beside
        # it: from the start
        copied = into == 0 and maker != last and self.count(m) == 1
        if within == 0:
            self.buffer(maker, "tied_grad_sum" if tied else "grad_sum", "gpu", FP32_BYTES * p,
                        (last,), at_end=copied, outlives_outputs=maker == last)
        if tied:  # the head's LM-weight grad, added into the sum by the head
            self.tied_grad(s, m, release=adder, outlives_outputs=copied and within == 0)
        elif block == self.L:  # the loss's LM-weight grad, then autograd's of the final norm:
            # two tensors, so the rounded sum (one block of both) cannot take the first's hole
            lm = self.model.head_params
            self.buffer(producer, "grads", "gpu", BF16_BYTES * lm, (producer,),
                        outlives_outputs=copied and within == 0)
            self.buffer(producer, "norm_grads", "gpu", BF16_BYTES * (p - lm), (producer,),
                        outlives_outputs=copied and within == 0)
        else:  # autograd's fresh bf16 grads of the rest, added into the sum within the task
            self.buffer(producer, "grads", "gpu", BF16_BYTES * (p - into), (producer,),
                        outlives_outputs=copied and within == 0)
        task, n = self.task_of(adder), self.count(m)  # an add per micro-batch of the group
        added = (sizes.GPU_GRAD_SUM_BYTES_PER_PARAM * (p - into)
                 + sizes.GPU_GRAD_INTO_SUM_BYTES_PER_PARAM * into)
        zeroed = FP32_BYTES * p if within == 0 else 0  # the sum starts as zeros
        self.update_task(adder, bytes=task.bytes + n * added + zeroed,
                         host_ops=task.host_ops + n)
        if within < self.Q - 1:
            return False
        task = self.task_of(producer)
        self.update_task(producer, bytes=task.bytes + sizes.GPU_GRAD_ROUND_BYTES_PER_PARAM * p,
                         host_ops=task.host_ops + 1)
        return True

    def tied_grad(self, s: int, m: int, release: str, outlives_outputs: bool = False) -> None:
        """The head's [V, h] LM-weight grad of a tied model: made by the head, and the
        embedding's grads once its backward has added its rows in; freed by `release`."""
        self.buffer(self.tid(K.HEAD, self.L, s, m), "tied_grad", "gpu",
                    BF16_BYTES * self.model.embedding_params, (release,),
                    outlives_outputs=outlives_outputs)

    # --- the per-step CPU work --------------------------------------------------------------------
    def blocks_in_arrival_order(self) -> list[int]:
        return [self.L, *reversed(range(self.L)), EMBEDDING]

    def update(self, s: int) -> None:
        """Optimizer step (+ cast, + NVMe state traffic) of every block for step s."""
        pol, L = self.policy, self.L
        last = self.groups[-1][0]  # the step's last group, by its first micro-batch
        final_grad = {
            b: (self.gpu_grad_producer[(s, b)] if b in self.gpu_updated
                else self.tid(K.ACCUMULATE_GRADS if self.host_sums else K.OFFLOAD_GRADS,
                              b, s, last))
            for b in self.blocks_in_arrival_order()
        }
        norm = None
        if self.train.max_grad_norm is not None:
            norm = self.add(kind=K.GRAD_NORM, lane=Lane.CPU, block=L, step=s,
                            key=(self.pos(s, last, "bwd", EMBEDDING), 3))
            for t in final_grad.values():
                self.edge(t, norm, "clip")
            if self.train.gpus > 1:  # each rank's norm covers its slices: sum the squares
                total = self.add(kind=K.REDUCE_NORM, lane=Lane.REDUCE, block=L, step=s,
                                 bytes=FP32_BYTES, comm_group="host",
                                 key=(self.pos(s, last, "bwd", EMBEDDING), 3))
                self.edge(norm, total, "data")
                norm = total

        def arrival_key(b: int) -> tuple[int, int]:
            return (self.grad_pos(s, last, b), 4)

        def deadline_key(b: int) -> tuple[int, int]:
            return (self.first_use_pos(s + 1, b), 4)

        for b in self.gpu_updated:  # after the step's backwards, in GPU order
            p = self.params(b)
            hbm_bytes, launches = sizes.gpu_adamw_cost(p, self.moments)
            opt = self.add(kind=K.OPTIMIZER_STEP, lane=Lane.GPU, block=b, step=s, params=p,
                           bytes=hbm_bytes, host_ops=launches, moment_precision=self.moments)
            self.edge(final_grad[b], opt, "grads")
            self.edge(norm, opt, "clip")

        opt_key = deadline_key if pol.schedule.optimizer_order == "deadline" else arrival_key
        # NVMe state reads are issued in the order the CPU is expected to run the steps: as
        # grads arrive, unless clipping holds every step until all grads are in.
        io_key = opt_key if norm is not None else arrival_key
        cpu_blocks = [b for b in self.blocks_in_arrival_order() if b not in self.gpu_updated]
        for b in sorted(cpu_blocks, key=io_key):
            p = self.host_params(b)
            extra = sizes.cpu_optimizer_extra_bytes_per_param(
                pol.kernels.cpu_optimizer, not self.host_sums, pol.optimizer_casts, self.moments)
            opt = self.add(kind=K.OPTIMIZER_STEP, lane=Lane.CPU, block=b, step=s, params=p,
                           bytes=extra * p, moment_precision=self.moments,
                           slot=NO_SLOT if self.host_sums else self.landing_slots[(s, last, b)],
                           key=opt_key(b))
            self.edge(final_grad[b], opt, "grads")
            self.edge(norm, opt, "clip")
            if not self.host_sums and pol.kernels.cpu_optimizer == "torch":  # an upcast buffer
                self.buffer(opt, "grad_fp32", "host", FP32_BYTES * p, (opt,))
            master_disk, moments_disk = self.disk[b]
            state_bytes = (sizes.MASTER_BYTES_PER_PARAM * master_disk
                           + moments_nbytes(moments_disk, self.moments))
            weight_bytes = BF16_BYTES * self.disk_weights[b]  # written, not read: all new
            if state_bytes + weight_bytes > 0:
                self.state_io(s, b, state_bytes, weight_bytes, opt, io_key(b))
            if pol.schedule.cast == "cpu_once" and not pol.optimizer_casts:
                cast = self.add(kind=K.CAST, lane=self.cast_lane, block=b, step=s,
                                bytes=FP32_BYTES * p, params=p, key=(opt_key(b)[0], 5))
                self.edge(opt, cast, "data")
                if state_bytes > 0 and pol.residency.master_on_nvme > 0:
                    # the cast reads the updated master weights from the staging buffer: write
                    # them back (and free the buffer) only after it
                    self.edge(cast, self.tid(K.WRITE_STATE, b, s), "data")

    def state_io(self, s: int, b: int, state_bytes: float, weight_bytes: float, opt: str,
                 key: tuple[int, int]) -> None:
        """Read the block's NVMe state into a staging slot before its optimizer step, and write
        it back after, with the new bf16 weights the step wrote beside it where some of those
        live on NVMe; a read waits for the write nvme_prefetch reads back, whose slot it takes
        (a block with only weights there reads nothing: its read takes the slot)."""
        pol, p = self.policy, self.host_params(b)
        reuse = (self.state_chain[-pol.schedule.nvme_prefetch][1]
                 if len(self.state_chain) >= pol.schedule.nvme_prefetch else None)
        slot = self.state_slots[reuse] if reuse else len(self.state_slots)
        common = {"block": b, "step": s, "params": p, "slot": slot}
        read = self.add(kind=K.READ_STATE, lane=Lane.NVME_READ, **common, bytes=state_bytes,
                        key=key)
        write = self.add(kind=K.WRITE_STATE, lane=Lane.NVME_WRITE, **common,
                         bytes=state_bytes + weight_bytes, key=key)
        self.state_slots[write] = slot
        if s > 0:
            self.edge(self.tid(K.WRITE_STATE, b, s - 1), read, "data")
        self.edge(reuse, read, "unit_reuse")
        self.state_chain.append((read, write))
        self.edge(read, opt, "data")
        self.edge(opt, write, "data")
        self.buffer(read, "staging", "host", state_bytes + weight_bytes, (write,))

    # --- static buffers ------------------------------------------------------------------------
    def static_buffers(self) -> None:
        model = self.model
        # what the placement records (policy_placement), and the executor allocates by
        placed = policy_placement(self.policy, self.train)
        # this rank's slice of each block's host state (the whole block on one rank)
        host_owned = {b: self.host_params(b) for b in self.disk}
        n = sum(p for b, p in host_owned.items() if b not in self.gpu_updated)
        sent_fp32 = placed["load_source"] == "master"  # fp32 arrives in a unit, then is cast
        unit = (BF16_BYTES + (FP32_BYTES if sent_fp32 else 0)) * self.gpu_params(0)
        self.buffer(None, runtime_buffer_id("gpu"), "gpu", sizes.GPU_RUNTIME_BYTES)
        self.buffer(None, GPU_WEIGHT_UNITS, "gpu", len(self.slots) * unit)
        updated_layers = sum(1 for b in self.gpu_updated if 0 <= b < self.L)
        loaded_layers = len(self.resident) - 2 - updated_layers  # resident, updated on the CPU
        self.buffer(None, GPU_RESIDENT_LAYERS, "gpu", loaded_layers * unit
                    + updated_layers * BF16_BYTES * model.layer_params)
        landing = FP32_BYTES if sent_fp32 else 0
        for b in (EMBEDDING, self.L):
            updated_here = b in self.gpu_updated  # no landing, fp32 grads in its state
            self.buffer(None, block_weights_buffer_id(b, self.L), "gpu",
                        (BF16_BYTES + (0 if updated_here else landing)) * self.gpu_params(b))
        self.buffer(None, GPU_UPDATED_STATE, "gpu",
                    sum(2 * FP32_BYTES * self.params(b) + moments_nbytes(self.params(b),
                                                                         self.moments)
                        for b in self.gpu_updated))
        self.buffer(None, runtime_buffer_id("host"), "host", sizes.HOST_RUNTIME_BYTES)
        # GPU-updated blocks keep their fp32 master in RAM as well: it is their home for
        # initialisation, loading and checkpoints (the GPU holds the live copy)
        master_disk = sum(m for m, _ in self.disk.values())
        self.buffer(None, HOST_MASTER, "host",
                    sizes.MASTER_BYTES_PER_PARAM * (sum(host_owned.values()) - master_disk))
        if placed["checkpoint_tier"] == "host":
            # page-locked buffers, one per layer and micro-batch of a sweep, allocated at the
            # first offload and reused by every sweep and step after it (H200, 3B: RSS +5.1 GiB
            # from micro-batch 1 to 32, the checkpoints' size)
            self.buffer(None, HOST_CHECKPOINTS, "host",
                        self.L * self.sweep_size * sizes.hidden_bytes(model, self.tokens))
        self.buffer(None, HOST_MOMENTS, "host", sum(
            moments_nbytes(host_owned[b] - self.disk[b][1], self.moments)
            for b in self.disk if b not in self.gpu_updated))
        weights_disk = sum(self.disk_weights.values())
        if placed["load_source"] == "upload":
            self.buffer(None, HOST_UPLOAD, "host",
                        sizes.UPLOAD_BYTES_PER_PARAM * (n - weights_disk))
        # offloaded bf16 grads land in page-locked buffers allocated once: in the blocks' upload
        # copies (nothing more), one per block, or a pool of host_grad_pool buffers of the
        # largest block's size
        cpu_blocks = [b for b in self.blocks_in_arrival_order() if b not in self.gpu_updated]
        if self.land_in_upload:
            landing = 0
        elif self.host_grad_pool < len(cpu_blocks):
            landing = self.host_grad_pool * max(host_owned[b] for b in cpu_blocks)
        else:
            landing = sum(host_owned[b] for b in cpu_blocks)
        self.buffer(None, HOST_GRAD_LANDING, "host", BF16_BYTES * landing)
        if placed["grad_sums"] == "host":
            self.buffer(None, HOST_GRAD_ACCUM, "host", FP32_BYTES * n)
        self.buffer(None, NVME_MASTER, "nvme", sizes.MASTER_BYTES_PER_PARAM * master_disk)
        self.buffer(None, NVME_MOMENTS, "nvme", sum(moments_nbytes(v, self.moments)
                                                    for _, v in self.disk.values()))
        self.buffer(None, NVME_WEIGHTS, "nvme", sizes.UPLOAD_BYTES_PER_PARAM * weights_disk)

    def reach_steps(self) -> int:
        """How many steps back a task's dependencies can reach: one, or more where a pool of
        slots is taken in turn fewer times a step than it has slots (a read of NVMe state waits
        for the write nvme_prefetch reads back, a backward for the offload grad_buffers
        backwards back, an offload for the landing buffer's consumer host_grad_pool back)."""
        reach = 1
        for slots, uses in ((self.policy.residency.grad_buffers, self.grad_slot_next),
                            (self.host_grad_pool, len(self.host_grad_consumers)),
                            (self.policy.schedule.nvme_prefetch, len(self.state_chain)),
                            (self.weight_staging_slots, len(self.weight_loads))):
            per_step = uses // self.num_steps
            if per_step:
                reach = max(reach, -(-slots // per_step))
        return reach

    def placement(self) -> Placement:
        pol, tokens = self.policy, self.tokens
        return Placement(
            **policy_placement(pol, self.train),
            gpu_updated=self.layout.gpu_updated, dedicated_layers=self.layout.dedicated_layers,
            ring_units=self.layout.ring_units, grad_landing=self.grad_landing,
            grad_landing_buffers=self.host_grad_pool if self.grad_landing == "pool" else 0,
            nvme_staging_slots=len(set(self.state_slots.values())),
            checkpoints_per_layer=self.sweep_size,
            head_chunk_tokens=(sizes.fused_head_chunk_tokens(self.model, tokens,
                                                             pol.kernels.head_chunk_bytes)
                               if pol.kernels.head_loss == "fused" else tokens),
            master_on_nvme=tuple(self.disk[b][0] for b in sorted(self.disk)),
            moments_on_nvme=tuple(self.disk[b][1] for b in sorted(self.disk)),
            weights_on_nvme=tuple(self.disk_weights[b] for b in sorted(self.disk)),
            weight_staging_slots=self.weight_staging_slots)

    def build(self, validate: bool = True) -> Plan:
        self.static_buffers()
        for s in range(self.num_steps):
            for first, _ in self.groups[::self.Q]:
                self.sweep(s, self.sweep_firsts(first))
            # One step ends when its last backward does: from there to the next step's, the
            # GPU waits for the updates it needs, runs forward and backward; the same cycle
            # every step, so the interval between two markers is the steady-state step.
            self.step_markers.append(self.gpu_order[-1])
            self.update(s)
        # cuBLAS's workspaces on the compute stream, the lane thread's and autograd's: made
        # before its first task (LaneDevice.prime_blas_workspaces), the first in its pool
        first = self.gpu_order[0]
        self.buffers[:0] = [Buffer(id=f"gpu.blas_workspace.{i}", tier="gpu",
                                   bytes=sizes.BLAS_WORKSPACE_BYTES, alloc_task=first)
                            for i in range(sizes.BLAS_WORKSPACES)]
        lane_order = {Lane.GPU: tuple(self.gpu_order)}
        by_lane: dict[str, list[str]] = {lane: [] for lane in LANES[1:]}
        for tid in self.worker_tasks:
            by_lane[self.task_of(tid).lane].append(tid)
        for lane, ids in by_lane.items():
            lane_order[lane] = tuple(sorted(ids, key=lambda t: self.task_of(t).priority))
        disciplines = {lane: ("strict" if lane in STREAM_LANES else "priority") for lane in LANES}
        plan = Plan(model=self.model, train=self.train, policy=self.policy,
                    num_steps=self.num_steps, graph=self.graph, lane_order=lane_order,
                    lane_discipline=disciplines, buffers=tuple(self.buffers),
                    placement=self.placement(),
                    meta={"step_markers": self.step_markers, "reach_steps": self.reach_steps()})
        if validate:
            plan.validate()
        return plan
