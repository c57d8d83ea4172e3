"""`--resume DIR`: the settings of the run whose checkpoints are in DIR, as its newest
checkpoint recorded them, with what this invocation may change: a new schedule (a longer
--steps among it), where the model goes (--out), where its NVMe state goes (--nvme-dir: the
checkpoint holds that state, restored into the new folder), how it runs. A finished run is continued only
for more --steps; else it is told where its model is, or how to export it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from layerslide.training.run import (
    RESCHEDULABLE,
    RESUMED_OUTPUTS,
    RESUMED_PLACES,
    RUNTIME_ONLY,
    RunConfig,
    RunError,
    flag_of,
)


def resumed(config: RunConfig, say: Callable[[str], None]) -> RunConfig:
    """The checkpointed run's config, with this one's schedule changes, outputs and runtime
    options; checkpoints keep going to DIR. say: where the notes on what changes go."""
    newest = _newest(config.resume)
    if newest is None:
        raise RunError(f"--resume {config.resume}: no complete checkpoint there (a run writes "
                       "them with --checkpoint-dir and --checkpoint-every/--checkpoint-minutes)")
    saved = newest.meta.get("run", {}).get("args")
    if saved is None:
        raise RunError(f"{newest.path} holds no `layerslide train` arguments to resume with")
    done = newest.meta.get("step", 0)
    _check_steps_left(config, saved, done)
    # what this command line gives, even at a default's value, that the checkpointed run had not
    changed = {k for k in (config.given & set(RunConfig.option_names())) - set(RUNTIME_ONLY)
               if config.option(k) != saved.get(k)}
    taken = sorted(changed & (RESCHEDULABLE | RESUMED_OUTPUTS | RESUMED_PLACES))
    _say_changes(config, saved, done, taken, sorted(set(changed) - set(taken)), say)
    ours = {k: config.option(k) for k in (*taken, *RUNTIME_ONLY)}
    # what this command line gives that the resumed run takes: the rest was said ignored
    given = set(taken) | (config.given & set(RUNTIME_ONLY))
    return RunConfig.from_options({**saved, **ours, "checkpoint_dir": config.resume},
                                  given=frozenset(given))


def _newest(root: str):
    """The newest checkpoint's info in root (several ranks': rank 0's of the newest step
    every rank holds), or None."""
    from layerslide.training.checkpoint_store import CheckpointError, CheckpointStore
    from layerslide.training.rank_checkpoints import newest_checkpoint

    try:
        return newest_checkpoint(CheckpointStore(root))
    except CheckpointError as err:
        raise RunError(str(err)) from err


def _check_steps_left(config: RunConfig, saved: dict, done: int) -> None:
    """Refuse a resume with no step left to run: a --steps not beyond the checkpoint's, or a
    finished run (said with where its model is, or the command that writes it)."""
    if "steps" in config.given and config.steps <= done:
        raise RunError(f"--steps {config.steps}: the checkpoint in {config.resume} is after step "
                       f"{done} already: to train on, give --steps above {done}")
    if "steps" in config.given or done < saved.get("steps", 0):
        return
    longer = (f"`layerslide train --resume {config.resume} --steps N` with N above {done} "
              "trains on from its optimizer state")
    out = config.out if "out" in config.given else saved.get("out")
    export = f"`layerslide export {config.resume} --out {out or 'FOLDER'}`"
    finished = f"--resume {config.resume}: that run finished all its {done} steps"
    if "out" in config.given:
        raise RunError(f"{finished}: nothing to train; its checkpoint of step {done} holds the "
                       f"trained state: write its model to {out} with {export}, or {longer}")
    if out and _holds_a_model(Path(out)):
        raise RunError(f"{finished} and its model is in {out}: nothing to resume; {longer}")
    missing = ("the run had no --out" if not out else
               f"its --out {out} holds no model (its final save failed or was stopped)")
    raise RunError(f"{finished} but {missing}; its checkpoint of step {done} holds the trained "
                   f"state: write the model with {export}, or {longer}")


def _holds_a_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _say_changes(config: RunConfig, saved: dict, done: int, taken: list[str],
                 ignored: list[str], say: Callable[[str], None]) -> None:
    """The notes on what a resume changes, what its --steps does to the learning rate, and
    what it ignores."""
    schedule = [k for k in taken if k not in RESUMED_OUTPUTS | RESUMED_PLACES]
    if schedule:
        say("note: resuming under a new schedule: " + ", ".join(
            f"{flag_of(k)} {config.option(k)} (was {saved.get(k)})" for k in schedule))
    if "steps" in taken:
        say(f"note: {lr_schedule_change(saved, config.steps, done)}")
    if "out" in taken:
        was = f"was {saved['out']}" if saved.get("out") else "the run had no --out"
        say(f"note: the resumed run saves its model to --out {config.out} ({was})")
    if "nvme_dir" in taken:
        was = (f"was {saved['nvme_dir']}, no longer read or written" if saved.get("nvme_dir")
               else "the run had none")
        say(f"note: the NVMe state moves to --nvme-dir {config.nvme_dir} ({was}): restored "
            "there from the checkpoint")
    if ignored:
        say("note: resuming with the checkpointed run's settings: "
            f"{', '.join(map(flag_of, ignored))} ignored")


def lr_schedule_change(saved: dict, steps: int, done: int) -> str:
    """What a new --steps does to the learning rate: the cosine decay after warmup runs over
    the new count (OptimConfig.decay_steps is --steps less warmup), so the next step's rate is
    the new curve's at that step."""
    from layerslide.executor.optim import OptimConfig

    run = RunConfig.from_options(saved)  # an old record's missing options: their defaults
    warmup = run.warmup_steps

    def schedule(total: int) -> OptimConfig:
        return OptimConfig(lr=run.lr, warmup_steps=warmup, min_lr_ratio=run.min_lr_ratio,
                           decay_steps=max(1, total - warmup))
    old, new = schedule(run.steps), schedule(steps)
    return (f"--steps {steps} (was {run.steps}): the learning rate's cosine decay now runs "
            f"over steps {warmup + 1}-{steps} instead of {warmup + 1}-{run.steps}: step "
            f"{done + 1} runs at "
            f"{new.lr_at(done):.2e} (the old schedule's {old.lr_at(done):.2e}) and it ends at "
            f"{new.lr_at(steps - 1):.2e} at step {steps}; the optimizer's moments go on from the "
            "checkpoint")
