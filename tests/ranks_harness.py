"""Runs of several ranks as processes on this machine, through gloo, as torchrun would start
them (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, a rendezvous on 127.0.0.1): the data-parallel
tests' harness. A rank's results come back as a file of its own (torch.save)."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.multiprocessing as mp

# how long a collective waits for the others: a failing rank ends the test, not hangs it
TIMEOUT_S = 60


def optim():
    from layerslide.executor.optim import OptimConfig

    return OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=2, decay_steps=4)


OPTIM = optim()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, job, *, gpus: int, hosts: int = 1) -> list[dict]:
    """Run worker(ranks, job) on gpus x hosts ranks; returns each rank's result, by rank."""
    world = gpus * hosts
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_entry, args=(worker, job, world, gpus, free_port()), nprocs=world,
                       start_method="spawn", join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _entry(rank: int, worker, job, world: int, gpus: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(gpus),
                      LOCAL_RANK=str(rank % gpus), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from layerslide.training.distributed import join, leave

    ranks = join("cpu", timeout_s=TIMEOUT_S)
    try:
        result = worker(ranks, job)
        torch.save(result, Path(job.out) / f"rank{rank}.pt")
    finally:
        leave(ranks)


def make_plan(tmp_path, name, config, *, accum, gpus=1, hosts=1, **policy):
    """The plan, and the file it is saved in (as a launch hands it to each rank)."""
    from helpers import SEQ, spec_of

    from layerslide.planner.build import build_plan
    from layerslide.planner.settings import Policy, TrainSpec

    plan = build_plan(spec_of(config, tmp_path / name),
                      TrainSpec(micro_batch=2, seq_len=SEQ, grad_accum=accum, max_grad_norm=1.0,
                                gpus=gpus, hosts=hosts), Policy.of(**policy))
    path = tmp_path / f"{name}.json"
    plan.save(path)
    return plan, str(path)


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """A short training run: a plan file, a model config, the optimizer, how long."""

    out: str
    plan: str
    config: object
    optim: object
    steps: int
    seed: int = 0
    nvme_dir: str | None = None  # each rank takes its own folder under it (rank<r>)
    save_to: str | None = None  # the trained model as an HF folder (rank 0 writes)
    options: dict = field(default_factory=dict)


def train(ranks, job: TrainJob) -> dict:
    """Train from random weights (or options["load_from"], an HF folder); the losses, the
    gathered initial and final weights, what this rank allocated, its slices of the state,
    and with options["eval_batches"] the eval of the initial weights. options["root"]: a
    checkpoint of the end state there. options["stop_on"]: that rank alone sets fit()'s stop
    event once its first step has run."""
    from layerslide.planner.plan import Plan
    from layerslide.training.checkpoint_store import CheckpointStore
    from layerslide.training.train_state import CheckpointSchedule
    from layerslide.training.trainer import Trainer

    plan = Plan.load(job.plan)
    nvme = None if job.nvme_dir is None else Path(job.nvme_dir) / f"rank{ranks.rank}"
    root = job.options.get("root")
    schedule = None if root is None else CheckpointSchedule(store=CheckpointStore(root),
                                                            every_steps=job.steps)
    with Trainer(config=job.config, plan=plan, optim=job.optim, device="cpu", ranks=ranks,
                 segment_steps=3, nvme_dir=nvme) as trainer:
        if "load_from" in job.options:
            trainer.load_checkpoint(job.options["load_from"])
        else:
            trainer.init_random(job.seed)
        initial = {n: v.clone() for n, v in trainer.state.named_master()}
        owned_at_start = {b: trainer.state.owned_master(b).clone() for b in trainer.blocks.blocks}
        scored = (trainer.evaluate(eval_batches(job.options["eval_batches"]))
                  if "eval_batches" in job.options else None)
        stop = threading.Event()
        stop_on = job.options.get("stop_on")

        def step_done(step: int) -> None:
            if ranks.rank == stop_on:
                stop.set()

        logs = trainer.fit(_data(), job.steps, checkpoints=schedule, on_step_done=step_done,
                           stop=stop)
        final = {n: v.clone() for n, v in trainer.state.named_master()}
        owned = {b: trainer.state.owned_master(b).clone() for b in trainer.blocks.blocks}
        whole = {b: trainer.state.whole_master(b).clone() for b in trainer.blocks.blocks}
        moments = {b: {k: t.clone() for k, t in _owned_moments(trainer.state, b).items()}
                   for b in trainer.state.moments}
        saved = None if job.save_to is None else trainer.save(job.save_to)
        refused = None
        if job.save_to is not None and job.options.get("save_again"):  # rank 0 refuses: it
            try:  # exists; the others' gathers must still end
                trainer.save(job.save_to)
            except ValueError as err:
                refused = str(err)
        return {"saved": saved, "whole": whole, "losses": [log.loss for log in logs],
                "stopped": trainer.stopped, "refused": refused,
                "grad_norms": [log.grad_norm for log in logs],
                "skipped_blocks": [log.skipped_blocks for log in logs],
                "tokens_per_step": [log.tokens_per_s * log.step_s for log in logs],
                "initial": initial, "final": final, "owned": owned, "moments": moments,
                "owned_at_start": owned_at_start,
                "eval": scored, "allocated": trainer.allocated_bytes(),
                "expected": plan.static_buffer_bytes()}


def eval_batches(count: int) -> list:
    """Held-out batches of the tests' synthetic data (another seed than training's)."""
    from helpers import SEQ, VOCAB

    from layerslide.data.sources import SyntheticTokens

    data = SyntheticTokens(VOCAB, SEQ, seed=7)
    return [data.next_batch(2) for _ in range(count)]


def _owned_moments(state, block: int) -> dict[str, torch.Tensor]:
    """This rank's moments of the block, its NVMe part (read back) and RAM part together."""
    ram = state.moments[block]
    if not state.disk_moments.get(block, 0):
        return dict(ram.tensors)
    disk = state.nvme.read_block(block)[1]
    return {name: torch.cat([disk.tensors[name], ram.tensors[name]]) for name in ram.tensors}


def checkpointed(ranks, job: TrainJob) -> dict:
    """Resume from the checkpoint under options["root"] (options["resume"]) and train; or
    train options["first"] steps, checkpoint, train on (the uninterrupted run) and, in a
    fresh Trainer, resume from that checkpoint and train as far again."""
    from layerslide.training.checkpoint_store import CheckpointStore

    store = CheckpointStore(job.options["root"])
    if job.options.get("resume"):
        return _resumed(ranks, job, store)
    first = job.options["first"]
    with _trainer(ranks, job) as trainer:
        trainer.init_random(job.seed)
        data = _data()
        from layerslide.training.train_state import CheckpointSchedule

        trainer.fit(data, first, checkpoints=CheckpointSchedule(store=store, every_steps=first))
        saved = _state_of(trainer)
        logs = trainer.fit(data, job.steps)
        uninterrupted = {"losses": [log.loss for log in logs],
                         "final": {n: v.clone() for n, v in trainer.state.named_master()}}
    return {"saved": saved, "uninterrupted": uninterrupted, "resumed": _resumed(ranks, job, store)}


def _resumed(ranks, job: TrainJob, store) -> dict:
    with _trainer(ranks, job) as trainer:
        data = _data()
        info = trainer.checkpointing.restore_state(store, data)
        restored = _state_of(trainer)
        logs = trainer.fit(data, job.steps)
        return {"step": info.step, "restored": restored, "losses": [log.loss for log in logs],
                "final": {n: v.clone() for n, v in trainer.state.named_master()}}


def _trainer(ranks, job: TrainJob):
    from layerslide.planner.plan import Plan
    from layerslide.training.trainer import Trainer

    nvme = None if job.nvme_dir is None else Path(job.nvme_dir) / f"rank{ranks.rank}"
    return Trainer(config=job.config, plan=Plan.load(job.plan), optim=job.optim, device="cpu",
                   ranks=ranks, segment_steps=2, nvme_dir=nvme)


def _data():
    from helpers import SEQ, VOCAB

    from layerslide.data.sources import SyntheticTokens

    return SyntheticTokens(VOCAB, SEQ, seed=1)


def _state_of(trainer) -> dict:
    """This rank's slices of the master weights and moments, and the step counts."""
    state = trainer.state
    return {"named": {n: v.clone() for n, v in state.named_master()},
            "owned": {b: state.owned_master(b).clone() for b in trainer.blocks.blocks},
            "moments": {b: {k: t.clone() for k, t in _owned_moments(state, b).items()}
                        for b in state.moments},
            "steps_taken": dict(state.steps_taken), "step": trainer.step}
