"""A fine-tuning run's settings, one typed field per `layerslide train` option: built once where
the run starts (the command line, a --config file, a checkpoint's record), stored with its
checkpoints and read back by a resume. `prepare` (training.prepare) resolves them into what runs.

The training settings and policy are the planner's own specs (`train`, `policy`); `options()`
flattens everything by option name, the form checkpoints have always stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from layerslide.planner.settings import (
    STATE_LAYOUT_FIELDS,
    ExecutorKnobs,
    Policy,
    TrainSpec,
    flag_fields,
    policy_flag_fields,
    run_ahead_from_env,
)
from layerslide.training.distributed import DEFAULT_TIMEOUT_S

# the plan's settings a train option sets: the fields that are flags (planner.settings says)
POLICY_OPTIONS = tuple(f.name for f in policy_flag_fields())
TRAIN_OPTIONS = tuple(f.name for f in flag_fields(TrainSpec))
DEFAULT_TRAIN = TrainSpec(micro_batch=8, seq_len=1024, grad_accum=1)

# what a resumed run takes from this invocation: how it runs, not what it computes
RUNTIME_ONLY = ("device", "serial", "trace_out", "log_jsonl", "tensorboard", "resume",
                "resume_fallback", "checkpoint_copy_ram", "collective_timeout")
# what a resumed run may change: how the steps are scheduled, not what the state means or where
# on the drive its parts lie (the sequence length positions the data)
RESCHEDULABLE = frozenset({*TRAIN_OPTIONS, *POLICY_OPTIONS, "plan", "gpu_memory",
                           "segment_steps", "steps"} - {"seq_len", *STATE_LAYOUT_FIELDS})
# where a resumed run's model goes, when this invocation names it
RESUMED_OUTPUTS = frozenset({"out", "overwrite"})
# where a resumed run keeps its NVMe state: the checkpoint's copy of it is restored there
RESUMED_PLACES = frozenset({"nvme_dir"})


class RunError(ValueError):
    """Settings a run cannot start with; the message names the option and what to change."""


def flag_of(name: str) -> str:
    """The command-line flag of an option."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Every option of one training run (the flags' defaults are these; a test holds them
    equal). `given`: the options the user set (typed or in the `config` file, those in
    `from_config`), told from defaults where a check or a resume needs to know."""

    # the model and its data
    model: str | None = None
    plan: str | None = None
    data: str | None = None
    data_format: str = "auto"
    text_field: str = "text"
    packing: Literal["auto", "on", "off"] = "auto"
    attend_across_documents: bool = False
    train_on_prompt: bool = False
    tokenizer: str | None = None
    eval_data: str | None = None
    eval_fraction: float | None = None
    eval_every: int | None = None
    eval_rows: int = 256
    # outputs
    out: str | None = None
    overwrite: bool = False
    save_every: int | None = None
    keep_saves: int = 2
    trace_out: str | None = None
    log_jsonl: str | None = None
    tensorboard: str | None = None
    # the optimizer
    steps: int = 10
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    # the machine
    gpu_memory: int | None = None
    device: str | None = None
    serial: bool = False
    segment_steps: int = 16
    seed: int = 0
    random_init: bool = False
    nvme_dir: str | None = None
    profile: str = "h200-bench"
    # how long a rank waits at a collective for the others (a run of several ranks)
    collective_timeout: float = DEFAULT_TIMEOUT_S
    # checkpoints of the full training state
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    checkpoint_minutes: float | None = None
    checkpoint_sync: bool = False
    checkpoint_copy_ram: int | None = None
    keep_checkpoints: int = 2
    resume: str | None = None
    resume_fallback: bool = False
    # the plan's training settings and policy (as the flags give them; the environment's
    # executor settings join them in prepare)
    train: TrainSpec = DEFAULT_TRAIN
    policy: Policy = field(default_factory=Policy.of)
    # where the options came from
    config: str | None = None
    given: frozenset[str] = frozenset()
    from_config: frozenset[str] = frozenset()

    @classmethod
    def run_fields(cls) -> tuple[str, ...]:
        """The options that are fields of their own (not of `train` or `policy`)."""
        return tuple(f.name for f in dataclasses.fields(cls)
                     if f.name not in ("train", "policy", "config", "given", "from_config"))

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return (*cls.run_fields(), *TRAIN_OPTIONS, *POLICY_OPTIONS)

    @classmethod
    def from_options(cls, options: Mapping[str, object], **where) -> RunConfig:
        """From options by name (a parsed command line, a checkpoint's stored record of any
        age: names it does not know are dropped, options added since take their defaults)."""
        defaults = cls()
        train = {k: options[k] for k in TRAIN_OPTIONS if k in options}
        policy = {k: options[k] for k in POLICY_OPTIONS if k in options}
        return cls(**{k: options[k] for k in cls.run_fields() if k in options},
                   train=dataclasses.replace(defaults.train, **train),
                   policy=defaults.policy.with_(**policy), **where)

    def options(self) -> dict[str, object]:
        """Every option by name, flat: what checkpoints store and `from_options` reads."""
        policy = self.policy.flat()
        return {**{k: getattr(self, k) for k in self.run_fields()}, **self.train.to_dict(),
                **{k: policy[k] for k in POLICY_OPTIONS}}

    def option(self, name: str) -> object:
        return self.options()[name]

    def with_(self, **changes) -> RunConfig:
        """This config with some options (by name, any of option_names) changed."""
        train = {k: changes.pop(k) for k in TRAIN_OPTIONS if k in changes}
        policy = {k: changes.pop(k) for k in POLICY_OPTIONS if k in changes}
        return dataclasses.replace(self, **changes,
                                   train=dataclasses.replace(self.train, **train),
                                   policy=self.policy.with_(**policy))

    def flag(self, name: str) -> str:
        """An option's flag, and where it was given when that was the --config file."""
        where = f" (in --config {self.config})" if name in self.from_config else ""
        return flag_of(name) + where

    def policy_in_environment(self) -> Policy:
        return with_environment(self.policy)


def with_environment(policy: Policy) -> Policy:
    """The policy with the executor settings the environment gives (recorded in the plan that
    runs): LAYERSLIDE_RUN_AHEAD and ExecutorKnobs.from_env's variables, where they are set."""
    knobs = ExecutorKnobs.env_settings()  # only what the environment sets
    return policy.with_(stream_run_ahead=run_ahead_from_env(policy.schedule.stream_run_ahead),
                        **knobs)


# options naming files or folders; those a run makes may not exist yet
PATH_OPTIONS = ("model", "data", "eval_data", "tokenizer", "plan", "profile", "out",
                "checkpoint_dir")
MADE_BY_THE_RUN = ("out", "checkpoint_dir")


def with_absolute_paths(options: dict) -> dict:
    """options with their paths made absolute, so that a resume or a rerun from another
    working directory finds the same files (a name that is no path, a preset, stays)."""
    options = dict(options)
    for key in PATH_OPTIONS:
        value = options.get(key)
        if value and (key in MADE_BY_THE_RUN or Path(value).expanduser().exists()):
            options[key] = str(Path(value).expanduser().resolve())
    if options.get("nvme_dir"):  # one folder per drive, comma-separated; made here if need be
        from layerslide.executor.nvme import nvme_folders

        options["nvme_dir"] = ",".join(str(folder.resolve())
                                       for folder in nvme_folders(options["nvme_dir"]))
    return options
