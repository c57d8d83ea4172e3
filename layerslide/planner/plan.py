"""Plan: the training step as data. Tasks on lanes, dependency edges, lane orders, buffers and
the placement of everything the executor allocates.

The simulator and the executor both interpret a Plan; neither knows how it was built. Every
binding the executor needs is a field here: a task's weight unit, landing or staging slot, a
lane's order; ids are labels made by task_id() and never parsed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Literal, get_args

import networkx as nx

from layerslide.kinds import Lane, TaskKind
from layerslide.planner.model import ModelSpec
from layerslide.planner.settings import (
    ActivationPlacement,
    MomentPrecision,
    Policy,
    TrainSpec,
    sums_grads_on_host,
)

PLAN_FORMAT_VERSION = 2

LANES = tuple(Lane)
# strict: tasks run in lane order (a CUDA stream); priority: the earliest ready task in lane
# order runs next (a worker that picks from a ready queue).
LANE_DISCIPLINES = ("strict", "priority")

# Steps a plan holds. At least MIN_STEPS, so that one step's optimizer tail meets the next
# step's forward and the last step has one before it to repeat (Plan.unroll); STEADY_STEPS to be
# simulated: with 2 the measured cycle can start while the CPU already works on that step's
# early grads (the head's), which looks shorter than steady state; from 3 on it does not.
MIN_STEPS = 2
STEADY_STEPS = 3

EMBEDDING = -1  # block index of the token embedding; decoder layers are 0..L-1, the head is L
# where offloaded grads land on the host (Placement.grad_landing)
GradLanding = Literal["upload", "per_block", "pool"]
# what a load sends to the GPU (Placement.load_source): the block's persistent bf16 upload copy,
# a bf16 copy the load's own cast task made, or the fp32 master weights (page-locked), which the
# compute task casts on the GPU
LoadSource = Literal["upload", "staging", "master"]
# where a CPU-updated block's grads of a step's micro-batches are summed in fp32
# (Placement.grad_sums): nowhere (one micro-batch a step), on the host, or on the GPU
GradSums = Literal["none", "host", "gpu"]
# which ranks a collective spans (Task.comm_group): a host's ranks (its GPU interconnect), one
# rank per host of the same local rank (the network), or every rank
CommGroup = Literal["host", "peers", "world"]
COMM_GROUPS = get_args(CommGroup)
DEDICATED = -1  # Task.unit of a block with a GPU unit of its own (it never slides)
NO_SLOT = -1


# The static buffers a plan sizes and the executor allocates, by id: the one ledger of what a
# run holds (Plan.static_buffer_bytes; the executor reports its own by these ids, and a test
# holds the two equal).
GPU_WEIGHT_UNITS = "gpu.weight_units"  # the sliding ring
GPU_RESIDENT_LAYERS = "gpu.resident_layers"  # decoder layers with a unit of their own
GPU_UPDATED_STATE = "gpu.updated_state"  # fp32 master, m, v and grad sums of GPU-updated blocks
HOST_MASTER = "host.master_fp32"
HOST_MOMENTS = "host.adam_moments"
HOST_UPLOAD = "host.weights_bf16"  # the bf16 copies the GPU loads (cast=cpu_once)
HOST_GRAD_LANDING = "host.grad_landing"
HOST_GRAD_ACCUM = "host.grad_accum_fp32"
HOST_CHECKPOINTS = "host.checkpoints"  # activations=host: one page-locked arena of all layers
NVME_MASTER = "nvme.master_fp32"
NVME_MOMENTS = "nvme.adam_moments"
NVME_WEIGHTS = "nvme.weights_bf16"


def block_weights_buffer_id(block: int, num_layers: int) -> str:
    """The GPU unit of the embedding or the head (and its fp32 landing, cast=gpu)."""
    return f"gpu.{block_name(block, num_layers)}.weights"


def block_name(block: int, num_layers: int) -> str:
    """emb, L0..L{n-1} or head: how ids name a block."""
    return "emb" if block == EMBEDDING else ("head" if block == num_layers else f"L{block}")


def task_id(*, kind: str, block: int, step: int, micro_batch: int, num_layers: int,
            for_kind: str = "") -> str:
    """The one way a task's id is made: a readable label, unique within a plan, never parsed."""
    tail = f".{for_kind}" if for_kind else ""
    return f"s{step}.m{micro_batch}.{kind}.{block_name(block, num_layers)}{tail}"


def task_buffer_id(task: str, name: str) -> str:
    """The id of a buffer that task `task` allocates."""
    return f"{task}.{name}"


@dataclass(frozen=True, kw_only=True)
class Task:
    """One unit of work on one lane. Its cost is derived from these amounts by a cost model."""

    id: str
    kind: TaskKind
    lane: Lane
    block: int  # EMBEDDING, 0..L-1, or L for final norm + head + loss
    step: int
    micro_batch: int = 0
    # the micro-batches from micro_batch on that the task runs in turn (a layer-major sweep's
    # group); its amounts are theirs together, `tokens` one micro-batch's
    micro_batches: int = 1
    # a load (or its cast, cast=cpu_per_load): the compute kind it serves, which tells a
    # block's forward load from its backward load within one micro-batch
    for_kind: str = ""
    flops: float = 0.0  # GEMM FLOPs (GPU compute tasks)
    attention_flops: float = 0.0  # forward attention FLOPs; backward tasks recompute them too
    bytes: float = 0.0  # bytes moved: copy size, HBM traffic of elementwise ops, disk I/O
    params: int = 0  # parameters touched (optimizer, cast, gradient accumulation)
    tokens: int = 0  # GEMM rows, for the matmul efficiency curve
    host_ops: int = 0  # host-side op dispatches (GPU tasks): the floor when work is small
    # The GPU weight unit a load fills and a compute task computes from: an index into the
    # sliding ring (Placement.ring_units), or DEDICATED for the block's own unit.
    unit: int = DEDICATED
    # offload_grads: the host landing buffer of the pool (Placement.grad_landing == "pool");
    # read_state / write_state: the NVMe staging buffer; backward: the GPU grad slot whose
    # reuse edge bounds the grads awaiting their offload (informational). NO_SLOT otherwise.
    slot: int = NO_SLOT
    casts_weights: bool = False  # cast=gpu: the compute task first casts the fp32 just loaded
    # optimizer_step: the precision of the AdamW moments it reads and writes (the CPU kernel's
    # speed depends on it beyond its bytes)
    moment_precision: str = ""
    comm_group: str = ""  # a collective's ranks (CommGroup); "" for every other task
    # (GPU position it serves, tie-break): a lane's order is its tasks by (priority, step)
    priority: tuple[int, int] = (0, 0)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What the executor allocates, where, and which way weights and grads take between them,
    as the planner laid it out: the executor reads this, never the policy's residency or
    schedule."""

    gpu_updated: tuple[int, ...] = ()  # updated on the GPU, in the order the next forward needs
    dedicated_layers: tuple[int, ...] = ()  # decoder layers with a GPU unit of their own
    ring_units: int  # GPU units the sliding layers share
    # where offloaded bf16 grads land on the host: in the block's bf16 upload copy ("upload"),
    # a buffer per block ("per_block"), or a pool of grad_landing_buffers buffers ("pool")
    grad_landing: GradLanding = "per_block"
    grad_landing_buffers: int = 0
    nvme_staging_slots: int = 0  # host buffers the NVMe state reads fill in turn
    # offloaded checkpoints of a layer waiting at once (host buffers or files): one per
    # micro-batch a sweep runs together
    checkpoints_per_layer: int = 1
    head_chunk_tokens: int  # rows of logits the head's loss makes at a time
    # Per block (index block + 1: the embedding first, the head last), how many of its fp32
    # master weights and of its AdamW moments live on NVMe: the first ones of its flat layout.
    master_on_nvme: tuple[int, ...] = ()
    moments_on_nvme: tuple[int, ...] = ()
    # likewise the bf16 weights loads read: the first ones of the block, read into one of
    # weight_staging_slots host buffers before each load
    weights_on_nvme: tuple[int, ...] = ()
    weight_staging_slots: int = 0
    load_source: LoadSource
    # the CPU optimizer step writes the new bf16 weights into the upload copy itself (no cast
    # task does)
    optimizer_writes_upload: bool
    grad_sums: GradSums
    checkpoint_tier: ActivationPlacement  # where checkpoints wait for their backward
    moment_precision: MomentPrecision  # of every block's AdamW m and v, wherever they live
    # ranks per host, sharing its one copy of every block's host state (planner.sharding), and
    # hosts, each holding a copy
    gpus: int = 1
    hosts: int = 1

    def __post_init__(self) -> None:
        for name, kind in (("grad_landing", GradLanding), ("load_source", LoadSource),
                           ("grad_sums", GradSums), ("checkpoint_tier", ActivationPlacement),
                           ("moment_precision", MomentPrecision)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"Placement.{name}={getattr(self, name)!r}: choose one of "
                                 f"{', '.join(get_args(kind))}")
        for name in ("gpu_updated", "dedicated_layers", "master_on_nvme", "moments_on_nvme",
                     "weights_on_nvme"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def disk_numel(self, block: int) -> tuple[int, int]:
        """(master, moments) elements of the block that live on NVMe."""
        if not self.master_on_nvme:
            return 0, 0
        return self.master_on_nvme[block + 1], self.moments_on_nvme[block + 1]

    def disk_weights_numel(self, block: int) -> int:
        """bf16 weights of the block that live on NVMe."""
        return self.weights_on_nvme[block + 1] if self.weights_on_nvme else 0

    @property
    def state_on_nvme(self) -> bool:
        """Part of some block's master weights, moments or bf16 weights lives on NVMe."""
        return any((*self.master_on_nvme, *self.moments_on_nvme, *self.weights_on_nvme))

    @property
    def uses_nvme(self) -> bool:
        """The run needs an NVMe folder: state or checkpoints there."""
        return self.state_on_nvme or self.checkpoint_tier == "nvme"

    def to_dict(self) -> dict:
        return asdict(self)


def policy_placement(policy: Policy, train: TrainSpec) -> dict:
    """The Placement fields that follow from the policy and training settings alone: what the
    builder writes, and what a plan file saved before they were fields is given on load."""
    sums_on_host = sums_grads_on_host(policy, train)
    return {"load_source": _LOAD_SOURCES[policy.schedule.cast],
            "optimizer_writes_upload": policy.optimizer_casts,
            "grad_sums": "host" if sums_on_host else "gpu" if train.grad_accum > 1 else "none",
            "checkpoint_tier": policy.residency.activations,
            "moment_precision": policy.residency.moment_precision,
            "gpus": train.gpus, "hosts": train.hosts}


_LOAD_SOURCES: dict[str, LoadSource] = {"cpu_once": "upload", "cpu_per_load": "staging",
                                        "gpu": "master"}


@dataclass(frozen=True, kw_only=True)
class Buffer:
    """Memory on one tier: allocated when alloc_task starts, or as it ends where at_end (None:
    before the plan runs), and freed when every task in release_tasks has ended (empty: held
    to the end)."""

    id: str
    tier: str
    bytes: int
    alloc_task: str | None = None
    release_tasks: tuple[str, ...] = ()
    # made as alloc_task ends rather than as it starts: a task's outputs (the gradients a
    # backward hands on), which its own scratch tensors have mostly been freed for
    at_end: bool = False
    # scratch its task still holds as it makes its outputs (at_end): the bf16 grad a new fp32
    # sum is copied from, the head's normed input; freed after them, as the inputs it releases
    outlives_outputs: bool = False
    # what the tensor is to the tasks that make and read it (checkpoint, final_hidden, dgrad,
    # fetched, ...): the executor hands a task's output to its readers by this name
    name: str = ""

    @property
    def is_static(self) -> bool:
        return self.alloc_task is None and not self.release_tasks


def runtime_buffer_id(tier: str) -> str:
    """The id of a tier's static buffer for what every run pays besides its tensors."""
    return f"{tier}.runtime"


@dataclass(kw_only=True)
class Plan:
    """A DAG of Tasks (networkx), the order of tasks on each lane, and the buffers they use."""

    model: ModelSpec
    train: TrainSpec
    policy: Policy
    num_steps: int
    graph: nx.DiGraph
    lane_order: dict[str, tuple[str, ...]]
    lane_discipline: dict[str, str]
    buffers: tuple[Buffer, ...]
    placement: Placement
    meta: dict = field(default_factory=dict)

    def task(self, task_id: str) -> Task:
        # the node's attributes without the NodeView: a search reads millions
        return self.graph._node[task_id]["task"]

    @property
    def stream_run_ahead(self) -> int:
        """How many of its tasks a stream lane may have queued on the GPU (0: no bound): the
        policy's, read through rather than copied into the placement, since the environment
        may set it on a plan already made (cli.options.with_env_overrides)."""
        return self.policy.schedule.stream_run_ahead

    @property
    def tasks(self) -> list[Task]:
        return [data["task"] for data in self.graph._node.values()]  # in the nodes' order

    def static_bytes(self, tier: str) -> int:
        """Bytes held for the whole run on a tier: a lower bound on its peak."""
        return sum(b.bytes for b in self.buffers if b.tier == tier and b.is_static)

    def dataflow(self) -> tuple[dict[tuple[str, str], Buffer], dict[tuple[str, str], Buffer]]:
        """The buffers by (task id, name): those each task makes, and those each releases."""
        made: dict[tuple[str, str], Buffer] = {}
        read: dict[tuple[str, str], Buffer] = {}
        for b in self.buffers:
            if b.alloc_task is not None:
                made[(b.alloc_task, b.name)] = b
            for t in b.release_tasks:
                if t != b.alloc_task:
                    assert (t, b.name) not in read, (t, b.name)
                    read[(t, b.name)] = b
        return made, read

    def static_buffer_bytes(self) -> dict[str, int]:
        """Bytes of each static buffer by id, the runtime estimates left out: what the executor
        allocates before the plan runs (or, the host checkpoints, at its first offload)."""
        runtime = {runtime_buffer_id(tier) for tier in ("gpu", "host", "nvme")}
        return {b.id: b.bytes for b in self.buffers if b.is_static and b.id not in runtime}

    def kept_bytes(self, tier: str) -> int:
        """Bytes a task makes and keeps to the end (cuBLAS's workspaces): with static_bytes,
        what the tier holds once the plan has run."""
        return sum(b.bytes for b in self.buffers
                   if b.tier == tier and b.alloc_task is not None and not b.release_tasks)

    def runtime_bytes(self, tier: str) -> int:
        """Bytes of the tier's runtime buffer (runtime_buffer_id): held for the run, but not by
        the framework's allocator (the CUDA context and cuDNN's workspaces; the process itself;
        cuBLAS's workspaces are buffers of their own)."""
        runtime = runtime_buffer_id(tier)  # made once, not per buffer
        return sum(b.bytes for b in self.buffers if b.id == runtime)

    def validate(self) -> None:
        """Raise ValueError if lane orders and dependencies cannot all be honoured."""
        # each task looked up once, not through the NodeView: tune validates every plan it builds
        tasks = {n: data.get("task") for n, data in self.graph._node.items()}
        missing = [n for n, task in tasks.items() if task is None]
        if missing:
            raise ValueError(f"edges name tasks that the plan does not have: {missing[:3]}")
        for lane, discipline in self.lane_discipline.items():
            if lane not in LANES or discipline not in LANE_DISCIPLINES:
                raise ValueError(f"unknown lane {lane!r} or discipline {discipline!r}; lanes: "
                                 f"{', '.join(LANES)}; disciplines: {', '.join(LANE_DISCIPLINES)}")
        if set(self.lane_order) != set(self.lane_discipline):
            raise ValueError("every lane needs both an order and a discipline")
        markers = self.meta.get("step_markers", ())
        if len(markers) != self.num_steps or any(m not in self.graph for m in markers):
            raise ValueError("meta.step_markers must name one task per planned step")
        lane_tasks = {lane: set(order) for lane, order in self.lane_order.items()}
        for t in tasks.values():
            if t.id not in lane_tasks.get(t.lane, ()):
                raise ValueError(f"task {t.id} is not in the order of its lane {t.lane}")
        if sum(len(o) for o in self.lane_order.values()) != self.graph.number_of_nodes():
            raise ValueError("a task appears in more than one lane order")
        for lane, order in self.lane_order.items():
            for a, b in pairwise(order):
                ta, tb = tasks[a], tasks[b]
                if (tb.priority, tb.step) < (ta.priority, ta.step):
                    raise ValueError(f"lane {lane}: {b} follows {a} but has a lower priority: a "
                                     "lane's order is its tasks by (priority, step); to reorder "
                                     "a lane, change the tasks' priorities as well")
        chains = [pair for lane, order in self.lane_order.items()
                  if self.lane_discipline[lane] == "strict" for pair in pairwise(order)]
        if not _acyclic(self.graph, chains):
            combined = nx.DiGraph(self.graph.edges)
            combined.add_edges_from(chains)
            cycle = nx.find_cycle(combined)
            raise ValueError(f"plan deadlocks: lane order contradicts dependencies at {cycle[:4]}")
        ids = [b.id for b in self.buffers]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"buffer ids must be unique; used more than once: {twice[:3]}")
        for b in self.buffers:
            for t in (b.alloc_task, *b.release_tasks):
                if t is not None and t not in tasks:  # the graph's nodes
                    raise ValueError(f"buffer {b.id} names unknown task {t}")
            if b.at_end and (b.alloc_task is None or b.alloc_task in b.release_tasks):
                raise ValueError(f"buffer {b.id} is made as its task ends (at_end): it needs "
                                 "an alloc_task, and another task to release it")
            if b.outlives_outputs and (b.at_end or b.alloc_task not in b.release_tasks):
                raise ValueError(f"buffer {b.id} outlives its task's outputs: it must be that "
                                 "task's scratch (released by it, not made at its end)")

    # --- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "policy": self.policy.to_dict(),
            "num_steps": self.num_steps,
            "tasks": [asdict(t) for t in self.tasks],
            "edges": [[u, v, d.get("reason", "")] for u, v, d in self.graph.edges(data=True)],
            "lane_order": {lane: list(order) for lane, order in self.lane_order.items()},
            "lane_discipline": dict(self.lane_discipline),
            "buffers": [asdict(b) for b in self.buffers],
            "placement": self.placement.to_dict(),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        if not isinstance(data, dict):
            raise ValueError(  # noqa: TRY004 (bad input at the boundary: ValueError, house style)
                f"not a layerslide plan: expected a JSON object, got {type(data).__name__}")
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a layerslide plan (rebuild it with `layerslide plan -o` or "
                             f"`layerslide tune -o`): {type(err).__name__}: {err}") from err

    @classmethod
    def _from_dict(cls, data: dict) -> Plan:
        version = data.get("format_version")
        if version != PLAN_FORMAT_VERSION:
            raise ValueError(f"plan format version {version!r} is not {PLAN_FORMAT_VERSION}: "
                             "rebuild the plan with this version of layerslide")
        graph = nx.DiGraph()
        for t in data["tasks"]:  # JSON holds the enums as strings and tuples as lists
            task = Task(**{**t, "kind": TaskKind(t["kind"]), "lane": Lane(t["lane"]),
                           "priority": tuple(t["priority"])})
            graph.add_node(task.id, task=task)
        for edge in data["edges"]:
            if not isinstance(edge, list) or len(edge) != 3:
                raise ValueError(f"edge {edge!r} is not [from task, to task, reason]: rebuild "
                                 "the plan, or mend that edge")
            u, v, reason = edge
            graph.add_edge(u, v, reason=reason)
        buffers = tuple(Buffer(**{**b, "release_tasks": tuple(b["release_tasks"])})
                        for b in data["buffers"])
        train, policy = TrainSpec.from_dict(data["train"]), Policy.from_dict(data["policy"])
        plan = cls(
            model=ModelSpec.from_dict(data["model"]),
            train=train,
            policy=policy,
            num_steps=data["num_steps"],
            graph=graph,
            lane_order={lane: tuple(o) for lane, o in data["lane_order"].items()},
            lane_discipline=dict(data["lane_discipline"]),
            buffers=buffers,
            # a file saved before a field was one has it from the policy, as the builder does
            placement=Placement(**{**policy_placement(policy, train), **data["placement"]}),
            meta=dict(data.get("meta", {})),
        )
        plan.validate()
        return plan

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON; ValueError names the path if it cannot be written."""
        try:
            Path(path).write_text(json.dumps(self.to_dict()))
        except OSError as err:
            raise ValueError(f"cannot write plan file {path}: {err.strerror or err}") from err

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read plan file {path}: {err}") from err
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err

    # --- segments: the repeating step structure, instantiated ------------------------------
    def unroll(self, num_steps: int) -> Plan:
        """The plan over `num_steps` steps: its first ones, or (more than it has) its last step
        repeated, with every edge, buffer and priority shifted by whole steps. A plan of S steps
        repeats a step whose dependencies reach at most S - 1 steps back."""
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}: a segment needs at least one step")
        if num_steps <= self.num_steps:
            return self._first_steps(num_steps)
        last = self.num_steps - 1
        template = [t for t in self.tasks if t.step == last]
        shift = sum(1 for t in template if t.lane == Lane.GPU)  # GPU positions per step
        L = self.model.num_layers

        def same_task(task: Task, step: int) -> str:
            return task_id(kind=task.kind, block=task.block, step=step,
                           micro_batch=task.micro_batch, num_layers=L, for_kind=task.for_kind)

        for t in template:
            if same_task(t, t.step) != t.id:
                raise ValueError(f"task {t.id}: its id is not task_id() of its fields; a plan "
                                 "to repeat must keep the ids the planner gave it")
        if self.reach_steps() > last:
            raise ValueError(f"the plan's dependencies reach {self.reach_steps()} steps back, "
                             f"further than its last step sees in {self.num_steps} steps: plan "
                             f"at least {self.reach_steps() + 1} (`layerslide plan --steps N`)")
        # units and slots are taken in turn, so a step may use them in another order than the
        # step before (3 layers through 2 units swap them every step): a repeated step applies
        # the permutation the last step applied to the one before it, once more per step
        turn = _step_permutations(self, template)

        def moved(task: Task, step: int) -> Task:
            pos, tie = task.priority
            ahead = step - task.step
            return replace(task, step=step, priority=(pos + ahead * shift, tie),
                           id=same_task(task, step),
                           unit=turn.unit(task.unit, ahead),
                           slot=turn.slot(task.kind, task.slot, ahead))
        graph = self.graph.copy()
        lane_order = {lane: list(order) for lane, order in self.lane_order.items()}
        buffers = list(self.buffers)
        markers = list(self.meta["step_markers"])
        owned = [b for b in self.buffers if b.alloc_task is not None
                 and self.task(b.alloc_task).step == last]
        for b in owned:
            if not b.id.startswith(b.alloc_task + ".") or any(
                    self.task(r).step != last for r in b.release_tasks):
                raise ValueError(f"buffer {b.id}: a repeated step's buffers must be named after "
                                 "the task that makes them and released within the step")
        for step in range(self.num_steps, num_steps):
            new = {t.id: moved(t, step) for t in template}
            for t in new.values():
                graph.add_node(t.id, task=t)
            for t in template:
                for u in self.graph.predecessors(t.id):
                    src = self.task(u)
                    graph.add_edge(same_task(src, src.step + step - last), new[t.id].id,
                                   reason=self.graph.edges[u, t.id].get("reason", ""))
            for lane, order in self.lane_order.items():
                lane_order[lane].extend(new[tid].id for tid in order if tid in new)
            for b in owned:
                alloc = new[b.alloc_task].id
                buffers.append(replace(b, id=alloc + b.id[len(b.alloc_task):], alloc_task=alloc,
                                       release_tasks=tuple(new[r].id for r in b.release_tasks)))
            markers.append(new[markers[last]].id)

        def rank(tid: str) -> tuple:
            task = graph.nodes[tid]["task"]
            return task.priority, task.step

        unrolled = Plan(model=self.model, train=self.train, policy=self.policy,
                        num_steps=num_steps, graph=graph,
                        lane_order={lane: tuple(sorted(o, key=rank))
                                    for lane, o in lane_order.items()},
                        lane_discipline=dict(self.lane_discipline), buffers=tuple(buffers),
                        placement=self.placement, meta={**self.meta, "step_markers": markers})
        unrolled.validate()
        return unrolled

    def reach_steps(self) -> int:
        """How many steps back a task's dependencies can reach (the planner's meta.reach_steps;
        1: only the step before). Plan.unroll repeats the last step only where its index is at
        least that, so that it has all of them. A plan without the figure counts as reaching
        one step further than its last step's edges go."""
        if "reach_steps" in self.meta:
            return int(self.meta["reach_steps"])
        last = self.num_steps - 1
        return 1 + max((last - self.task(u).step for t in self.tasks if t.step == last
                        for u in self.graph.predecessors(t.id)), default=0)

    def _first_steps(self, count: int) -> Plan:
        """The plan restricted to its first `count` steps (tasks of later steps dropped)."""
        if count == self.num_steps:
            return self
        keep = [n for n in self.graph if self.task(n).step < count]
        graph = self.graph.subgraph(keep).copy()
        lane_order = {lane: tuple(t for t in order if t in graph)
                      for lane, order in self.lane_order.items()}
        buffers = tuple(b for b in self.buffers if all(
            t in graph for t in (b.alloc_task, *b.release_tasks) if t is not None))
        trimmed = Plan(model=self.model, train=self.train, policy=self.policy, num_steps=count,
                       graph=graph, lane_order=lane_order, lane_discipline=self.lane_discipline,
                       buffers=buffers, placement=self.placement,
                       meta={**self.meta, "step_markers": self.meta["step_markers"][:count]})
        trimmed.validate()
        return trimmed

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_dict() == other.to_dict()


@dataclass(frozen=True)
class SlotSpace:
    """Task kinds whose Task.slot indexes one pool of buffers, taken in turn."""

    what: str  # the buffers, as messages name them
    kinds: tuple[TaskKind, ...]
    # the Placement field that counts the pool ("": not the placement's, the policy's GPU grad
    # slots, which bound grads awaiting their offload and which the executor never allocates)
    count_field: str

    def placed(self, placement: Placement) -> int | None:
        """How many buffers the placement holds for the pool (None: it holds none)."""
        return getattr(placement, self.count_field) if self.count_field else None


# the slots' spaces, defined once: the executor checks a plan's slots against the placement by
# them, unroll turns each as the last step did
SLOT_SPACES = (
    SlotSpace("landing", (TaskKind.OFFLOAD_GRADS, TaskKind.ACCUMULATE_GRADS,
                          TaskKind.OPTIMIZER_STEP), "grad_landing_buffers"),
    SlotSpace("staging", (TaskKind.READ_STATE, TaskKind.WRITE_STATE), "nvme_staging_slots"),
    SlotSpace("GPU grad", (TaskKind.BACKWARD,), ""),
    SlotSpace("weight staging", (TaskKind.READ_WEIGHTS, TaskKind.LOAD_WEIGHTS),
              "weight_staging_slots"),
)


def slot_space(kind: TaskKind) -> SlotSpace | None:
    """The space of slots a task of this kind takes from (None: a kind that takes none)."""
    return next((space for space in SLOT_SPACES if kind in space.kinds), None)


def _slot_count(plan: Plan, space: SlotSpace) -> int:
    """How many slots a space has: its tasks take them in turn, one after another."""
    placed = space.placed(plan.placement)
    return plan.policy.residency.grad_buffers if placed is None else placed


@dataclass
class _Permutations:
    """Where the last step moved each unit taken the step before (LRU keeps them a
    permutation), and how far it turned each space of slots (taken in turn: a rotation)."""

    units: dict[int, int]
    slot_turns: dict[SlotSpace, tuple[int, int]]  # space -> (turn, slot count)

    def unit(self, value: int, times: int) -> int:
        if value < 0:  # DEDICATED
            return value
        for _ in range(times):
            value = self.units[value]
        return value

    def slot(self, kind: TaskKind, value: int, times: int) -> int:
        if value < 0:  # NO_SLOT
            return value
        turn, count = self.slot_turns[slot_space(kind)]
        return (value + times * turn) % count


def _step_permutations(plan: Plan, template: list[Task]) -> _Permutations:
    if plan.num_steps < MIN_STEPS:
        raise ValueError(f"a plan of {plan.num_steps} step cannot be repeated: plan at least "
                         f"{MIN_STEPS}")
    units: dict[int, int] = {}
    turns: dict[SlotSpace, tuple[int, int]] = {}
    L = plan.model.num_layers

    def refuse(what: str) -> None:
        raise ValueError(f"cannot repeat the plan's last step: {what}; plan it with more steps "
                         "or as the planner makes it")

    for t in template:
        before = task_id(kind=t.kind, block=t.block, step=t.step - 1,
                         micro_batch=t.micro_batch, num_layers=L, for_kind=t.for_kind)
        prev = plan.task(before) if before in plan.graph else None
        if prev is None:  # new in the last step: fine unless it takes a unit or slot in turn
            if t.unit >= 0 or t.slot >= 0:
                refuse(f"task {t.id} has no counterpart in the step before")
            continue
        if (prev.unit < 0) != (t.unit < 0) or (prev.slot < 0) != (t.slot < 0):
            refuse(f"task {t.id} takes a unit or slot where the step before took none")
        if t.unit >= 0 and units.setdefault(prev.unit, t.unit) != t.unit:
            refuse(f"unit {prev.unit} of the step before became two units")
        if t.slot >= 0:
            space = slot_space(t.kind)
            if space is None:
                refuse(f"task {t.id} takes slot {t.slot}, but no task of its kind takes one")
            count = _slot_count(plan, space)
            if not 0 <= t.slot < count:
                refuse(f"task {t.id} takes slot {t.slot} of {count}")
            turn = (t.slot - prev.slot) % count
            if turns.setdefault(space, (turn, count)) != (turn, count):
                refuse(f"the slots of {space.kinds[0]} do not turn by one step's count")
    if sorted(units) != sorted(units.values()):
        refuse("its units are not a permutation of the step before's")
    return _Permutations(units, turns)


def _acyclic(graph: nx.DiGraph, extra_edges: list[tuple[str, str]]) -> bool:
    """Whether graph plus extra_edges has no cycle (Kahn's algorithm, without copying the graph:
    tune validates thousands of plans)."""
    succ = graph._succ  # the adjacency dicts, not their views (one view per task otherwise)
    indegree = {n: len(preds) for n, preds in graph._pred.items()}
    extra_out: dict[str, list[str]] = {}
    for u, v in extra_edges:
        indegree[v] += 1
        extra_out.setdefault(u, []).append(v)
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
        for m in extra_out.get(n, ()):
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    return seen == len(indegree)
