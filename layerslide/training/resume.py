"""`--resume DIR`: the settings of the run whose checkpoints are in DIR, as its newest
checkpoint recorded them, with what this invocation may change (a new schedule, how it runs)."""

from __future__ import annotations

from collections.abc import Callable

from layerslide.training.run import RESCHEDULABLE, RUNTIME_ONLY, RunConfig, RunError, flag_of


def resumed(config: RunConfig, say: Callable[[str], None]) -> RunConfig:
    """The checkpointed run's config, with this one's schedule changes and runtime options;
    checkpoints keep going to DIR. say: where the notes on what changes go."""
    from layerslide.training.checkpoint_store import CheckpointError, CheckpointStore

    try:
        newest = CheckpointStore(config.resume).latest()
    except CheckpointError as err:
        raise RunError(str(err)) from err
    if newest is None:
        raise RunError(f"--resume {config.resume}: no complete checkpoint there (a run writes "
                       "them with --checkpoint-dir and --checkpoint-every/--checkpoint-minutes)")
    saved = newest.meta.get("run", {}).get("args")
    if saved is None:
        raise RunError(f"{newest.path} holds no `layerslide train` arguments to resume with")
    if newest.meta.get("step", 0) >= saved.get("steps", 0):
        where = f" (its model is in {saved['out']})" if saved.get("out") else ""
        raise RunError(f"--resume {config.resume}: that run finished all its {saved['steps']} "
                       f"steps{where}: nothing to resume; to train on, start a new run with "
                       "--model set to its saved folder")
    # what this command line gives, even at a default's value, that the checkpointed run had not
    changed = {k for k in (config.given & set(RunConfig.option_names())) - set(RUNTIME_ONLY)
               if config.option(k) != saved.get(k)}
    rescheduled = sorted(changed & RESCHEDULABLE)
    ignored = sorted(changed - RESCHEDULABLE)
    if rescheduled:
        say("note: resuming under a new schedule: " + ", ".join(
            f"{flag_of(k)} {config.option(k)} (was {saved.get(k)})" for k in rescheduled))
    if ignored:
        say("note: resuming with the checkpointed run's settings: "
            f"{', '.join(map(flag_of, ignored))} ignored")
    ours = {k: config.option(k) for k in (*rescheduled, *RUNTIME_ONLY)}
    # what this command line gives that the resumed run takes: the rest was said ignored
    given = set(rescheduled) | (config.given & set(RUNTIME_ONLY))
    return RunConfig.from_options({**saved, **ours, "checkpoint_dir": config.resume},
                                  given=frozenset(given))
