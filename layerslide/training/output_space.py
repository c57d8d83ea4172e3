"""The room a run's outputs will take on their disks, checked before any work: the trained model
(--out, in bf16) and its --save-every saves beside it, the checkpoints of the full training state
(--checkpoint-dir: fp32 master weights and AdamW moments at the plan's precision), and a generous
allowance for the logs (--log-jsonl, --tensorboard, --trace-out). Outputs on one filesystem
share its free bytes; a run that would fill one is refused with the numbers and what to change.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from layerslide import outputs
from layerslide.outputs import filesystem_of, size
from layerslide.planner.model import BF16_BYTES
from layerslide.planner.plan import Plan
from layerslide.planner.settings import moments_nbytes
from layerslide.planner.sizes import MASTER_BYTES_PER_PARAM
from layerslide.training.run import RunConfig, RunError

KIB, MIB = 1024, 1024**2
# a model folder beside its weights: config, safetensors headers and index, the run's options,
# its prediction check and timeline figure (the tokenizer's files are counted as they are)
MODEL_EXTRA_BYTES = MIB
# a checkpoint beside its tensors: page padding per tensor (4 KiB, at most 6 a block) and per
# NVMe file part (2), and the manifest: the store keeps this slack free for the one it writes
CHECKPOINT_PADDING_PER_BLOCK = 8 * 4 * KIB
CHECKPOINT_SLACK_BYTES = 16 * MIB
# the logs' allowances, about 3x what a tiny CPU run wrote: a JSONL record 322 B a step, a trace
# event 236 B a task, memory samples 75 B each every 20 ms a tier (so per second of the run)
LOG_BASE_BYTES = MIB
JSONL_BYTES_PER_STEP = KIB
TENSORBOARD_BYTES_PER_STEP = 2 * KIB
TRACE_BYTES_PER_TASK = 768
TRACE_BYTES_PER_RUN_S = 16 * KIB


@dataclass(frozen=True)
class Need:
    """Bytes one output will take at its peak; what: what they are; fix: what to change."""

    flag: str
    path: str
    bytes: int
    what: str
    fix: str


@dataclass(frozen=True)
class Progress:
    """Where a run starts: steps done, checkpoints and --save-every saves already on disk."""

    steps_done: int = 0
    checkpoints: int = 0
    saves: int = 0


def model_bytes(num_params: int, tokenizer: Path | None) -> int:
    """A saved model folder: the weights in bf16 and the tokenizer's files beside them."""
    from layerslide.training.hf_io import tokenizer_files

    extra = sum(path.stat().st_size for path in tokenizer_files(tokenizer).values())
    return num_params * BF16_BYTES + extra + MODEL_EXTRA_BYTES


def export_need(num_params: int, tokenizer: Path | None, out: str) -> Need:
    """An export's model folder (layerslide export --out)."""
    return Need("--out", out, model_bytes(num_params, tokenizer),
                "the model folder: bf16 weights, tokenizer and config",
                "give --out a folder on a disk with room")


def checkpoint_bytes(plan: Plan, *, nvme_files_copied: bool) -> int:
    """One checkpoint: each block's fp32 master weights and moments in RAM, padded; a block's
    parts on NVMe join as hard links, copies only where the checkpoint is on another disk (on
    the same one, the NVMe tier's own check counts the copies they become)."""
    placement, spec = plan.placement, plan.model
    total = 0
    for block in range(-1, spec.num_layers + 1):
        n = spec.block_params(block)
        on_gpu = block in placement.gpu_updated
        master_k, moments_k = (0, 0) if on_gpu else placement.disk_numel(block)
        weights_k = 0 if on_gpu else placement.disk_weights_numel(block)
        total += (MASTER_BYTES_PER_PARAM * (n - master_k)
                  + moments_nbytes(n - moments_k, placement.moment_precision)
                  + CHECKPOINT_PADDING_PER_BLOCK)
        if nvme_files_copied:
            total += (MASTER_BYTES_PER_PARAM * master_k + BF16_BYTES * weights_k
                      + moments_nbytes(moments_k, placement.moment_precision))
    return total


def rotated_peak(existing: int, written: int, keep: int) -> int:
    """The most of a rotated output (checkpoints, saves) on disk at once beyond the `existing`
    ones, when `written` more come: each new one is whole before the oldest beyond `keep` go."""
    if not written:
        return 0
    return max(1, min(existing + written - 1, keep) + 1 - existing)


def checkpoints_written(config: RunConfig, steps_done: int) -> int:
    """Checkpoints the run writes: every --checkpoint-every steps and at the end (with
    --checkpoint-minutes, as many as one a step, for all it can tell)."""
    steps = range(steps_done + 1, config.steps + 1)
    if config.checkpoint_minutes:
        return len(steps)
    if config.checkpoint_every:
        return len({s for s in steps if s % config.checkpoint_every == 0} | {config.steps})
    return 1


def saves_written(config: RunConfig, steps_done: int) -> int:
    """--save-every saves the run writes: every N steps before the last."""
    if not config.save_every:
        return 0
    return len([s for s in range(config.save_every, config.steps, config.save_every)
                if s > steps_done])


def output_needs(config: RunConfig, plan: Plan, *, tokenizer: Path | None,
                 predicted_step_s: float | None, start: Progress = Progress()) -> list[Need]:
    """What each output will take at its peak, by flag."""
    steps = config.steps - start.steps_done
    needs = []
    if config.out:
        needs.append(_model_need(config, plan, tokenizer, start))
    if config.checkpoint_dir:
        needs.append(_checkpoint_need(config, plan, start))
    logs = {"log_jsonl": (JSONL_BYTES_PER_STEP * steps, "records"),
            "tensorboard": (TENSORBOARD_BYTES_PER_STEP * steps, "event files"),
            "trace_out": (_trace_bytes(plan, steps, predicted_step_s), "trace")}
    for name, (nbytes, what) in logs.items():
        path = getattr(config, name)
        if path:
            needs.append(Need(config.flag(name), path, LOG_BASE_BYTES + nbytes,
                              f"an allowance for {steps} steps' {what}",
                              f"give {config.flag(name)} a path on a disk with room, or drop it"))
    return needs


def _model_need(config: RunConfig, plan: Plan, tokenizer: Path | None, start: Progress) -> Need:
    """The model at the end, and the --save-every saves kept beside it along the way."""
    one = model_bytes(plan.model.total_params, tokenizer)
    written = saves_written(config, start.steps_done)
    count = max(1, min(start.saves + written, config.keep_saves) + 1 - start.saves) \
        if written else 1
    what = "the model folder: bf16 weights, tokenizer and config"
    fix = f"give {config.flag('out')} a folder on a disk with room"
    if count > 1:
        what = (f"the model folder and {count - 1} --save-every save(s) of it kept beside it, "
                f"{size(one)} each")
        fix += " or keep fewer saves (--keep-saves)" if config.keep_saves > 1 else ""
    return Need(config.flag("out"), config.out, count * one, what, fix)


def _checkpoint_need(config: RunConfig, plan: Plan, start: Progress) -> Need:
    copied = not config.nvme_dir or any(
        filesystem_of(folder)[0] != filesystem_of(config.checkpoint_dir)[0]
        for folder in config.nvme_dir.split(","))
    one = checkpoint_bytes(plan, nvme_files_copied=copied)
    keep = config.keep_checkpoints
    count = rotated_peak(start.checkpoints, checkpoints_written(config, start.steps_done), keep)
    what = (f"{count} checkpoint(s) of {size(one)}" + (
        f": --keep-checkpoints {keep} and the one being written" if count == keep + 1 else "")
        + f", and {size(CHECKPOINT_SLACK_BYTES)} the store keeps free while it writes one")
    fix = f"give {config.flag('checkpoint_dir')} a folder on a disk with room" + (
        " or keep fewer checkpoints (--keep-checkpoints)" if keep > 1 else "")
    return Need(config.flag("checkpoint_dir"), config.checkpoint_dir,
                count * one + CHECKPOINT_SLACK_BYTES, what, fix)


def _trace_bytes(plan: Plan, steps: int, predicted_step_s: float | None) -> int:
    """--trace-out keeps every task of every step, and memory samples as the run goes."""
    tasks = plan.graph.number_of_nodes() / max(1, plan.num_steps)
    return int(TRACE_BYTES_PER_TASK * tasks * steps
               + TRACE_BYTES_PER_RUN_S * (predicted_step_s or 0.0) * steps)


def check_output_space(needs: list[Need], whose: str = "the run's outputs") -> None:
    """Refuse a run whose outputs would fill a disk: per filesystem, what each needs there
    against what it has free (`whose`: what the refusal calls them)."""
    shared: dict[int, list[Need]] = defaultdict(list)
    for need in needs:
        shared[filesystem_of(need.path)[0]].append(need)
    for group in shared.values():
        total, free = sum(n.bytes for n in group), outputs.free_bytes(group[0].path)
        if total > free:
            raise RunError(_too_little_room(group, total, free, whose))


def _too_little_room(group: list[Need], total: int, free: int, whose: str) -> str:
    mount = filesystem_of(group[0].path)[1]
    parts = "; ".join(f"{n.flag} {n.path} needs {size(n.bytes)} ({n.what})" for n in group)
    whole = f", {size(total)} in all," if len(group) > 1 else ""
    return (f"not enough room for {whose}: {parts}{whole} where the disk of {mount} "
            f"has {size(free)} ({free} bytes) free: free {size(total - free)} there, or "
            + "; or ".join(n.fix for n in group))
