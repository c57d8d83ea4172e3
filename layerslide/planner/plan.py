"""Plan: the training step as data. Tasks on lanes, dependency edges, lane orders and buffers.

The simulator and the executor both interpret a Plan; neither knows how it was built.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import networkx as nx

from layerslide.planner.model import ModelSpec
from layerslide.planner.settings import Policy, TrainSpec

PLAN_FORMAT_VERSION = 1

LANES = ("gpu", "h2d", "d2h", "cpu", "cpu_cast", "nvme_read", "nvme_write")
# strict: tasks run in lane order (a CUDA stream); priority: the earliest ready task in lane
# order runs next (a worker that picks from a ready queue).
LANE_DISCIPLINES = ("strict", "priority")

EMBEDDING = -1  # block index of the token embedding; decoder layers are 0..L-1, the head is L


@dataclass(frozen=True, kw_only=True)
class Task:
    """One unit of work on one lane. Its cost is derived from these amounts by a cost model."""

    id: str
    kind: str
    lane: str
    layer: int  # block index: EMBEDDING, 0..L-1, or L for final norm + head + loss
    step: int
    micro_batch: int = 0
    flops: float = 0.0  # GEMM FLOPs (GPU compute tasks)
    attention_flops: float = 0.0  # forward attention FLOPs; backward tasks recompute them too
    bytes: float = 0.0  # bytes moved: copy size, HBM traffic of elementwise ops, disk I/O
    params: int = 0  # parameters touched (optimizer, cast, gradient accumulation)
    tokens: int = 0  # GEMM rows, for the matmul efficiency curve
    host_ops: int = 0  # host-side op dispatches (GPU tasks): the floor when work is small
    # Which pre-allocated GPU unit a load fills (the weight cache unit; -1 for dedicated
    # buffers of resident blocks): the executor follows it rather than re-deriving the
    # planner's unit assignment. On a layer's backward: the grad slot of the reuse edge that
    # bounds how many layers' grads await their offload (informational).
    unit: int = -1


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
    meta: dict = field(default_factory=dict)

    def task(self, task_id: str) -> Task:
        return self.graph.nodes[task_id]["task"]

    @property
    def tasks(self) -> list[Task]:
        return [self.graph.nodes[n]["task"] for n in self.graph.nodes]

    def static_bytes(self, tier: str) -> int:
        """Bytes held for the whole run on a tier: a lower bound on its peak."""
        return sum(b.bytes for b in self.buffers if b.tier == tier and b.is_static)

    def kept_bytes(self, tier: str) -> int:
        """Bytes a task makes and keeps to the end (cuBLAS's workspaces): with static_bytes,
        what the tier holds once the plan has run."""
        return sum(b.bytes for b in self.buffers
                   if b.tier == tier and b.alloc_task is not None and not b.release_tasks)

    def runtime_bytes(self, tier: str) -> int:
        """Bytes of the tier's runtime buffer (runtime_buffer_id): held for the run, but not by
        the framework's allocator (the CUDA context and cuDNN's workspaces; the process itself;
        cuBLAS's workspaces are buffers of their own)."""
        return sum(b.bytes for b in self.buffers if b.id == runtime_buffer_id(tier))

    def validate(self) -> None:
        """Raise ValueError if lane orders and dependencies cannot all be honoured."""
        missing = [n for n, data in self.graph.nodes(data=True) if "task" not in data]
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
        for t in self.tasks:
            if t.id not in lane_tasks.get(t.lane, ()):
                raise ValueError(f"task {t.id} is not in the order of its lane {t.lane}")
        if sum(len(o) for o in self.lane_order.values()) != self.graph.number_of_nodes():
            raise ValueError("a task appears in more than one lane order")
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
                if t is not None and t not in self.graph:
                    raise ValueError(f"buffer {b.id} names unknown task {t}")
            if b.at_end and (b.alloc_task is None or b.alloc_task in b.release_tasks):
                raise ValueError(f"buffer {b.id} is made as its task ends (at_end): it needs "
                                 "an alloc_task, and another task to release it")

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
        for t in data["tasks"]:
            task = Task(**t)
            graph.add_node(task.id, task=task)
        for u, v, reason in data["edges"]:
            graph.add_edge(u, v, reason=reason)
        buffers = tuple(Buffer(**{**b, "release_tasks": tuple(b["release_tasks"])})
                        for b in data["buffers"])
        plan = cls(
            model=ModelSpec.from_dict(data["model"]),
            train=TrainSpec.from_dict(data["train"]),
            policy=Policy.from_dict(data["policy"]),
            num_steps=data["num_steps"],
            graph=graph,
            lane_order={lane: tuple(o) for lane, o in data["lane_order"].items()},
            lane_discipline=dict(data["lane_discipline"]),
            buffers=buffers,
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

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_dict() == other.to_dict()


def _acyclic(graph: nx.DiGraph, extra_edges: list[tuple[str, str]]) -> bool:
    """Whether graph plus extra_edges has no cycle (Kahn's algorithm, without copying the graph:
    tune validates thousands of plans)."""
    indegree = {n: d for n, d in graph.in_degree()}
    extra_out: dict[str, list[str]] = {}
    for u, v in extra_edges:
        indegree[v] += 1
        extra_out.setdefault(u, []).append(v)
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    succ = graph.succ
    while ready:
        n = ready.pop()
        seen += 1
        for m in (*succ[n], *extra_out.get(n, ())):
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    return seen == len(indegree)
