"""`prepare(config) -> Run`: a RunConfig resolved into what runs, every input checked before
any weight is allocated: the outputs, the model folder, the data, the plan (a --plan file as
it is, or one built from the settings) and its fit on this machine, the checkpoint schedule.
Errors are RunErrors (ValueErrors) whose message says what to change."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from layerslide import hub
from layerslide.executor.ranks import SINGLE, Ranks
from layerslide.planner.model import ModelSpec, resolve_model
from layerslide.planner.plan import Plan
from layerslide.training import inputs
from layerslide.training.plan_checks import (
    check_fits,
    refuse_a_plan_for_other_ranks,
    refuse_options_a_plan_replaces,
    refuse_policy_options_that_would_not_act,
    with_lanes_first,
    with_rank_threads,
)
from layerslide.training.run import RunConfig, RunError, with_absolute_paths, with_environment

GIB = 1024**3

def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass(frozen=True, kw_only=True)
class Run:
    """A prepared run: its config as resolved (the data, the GPU cap and the profile it uses),
    the model, the plan and its prediction, the data and what the run writes."""

    config: RunConfig
    spec: ModelSpec
    hf_config: Any  # transformers.PretrainedConfig
    weights: Path | None  # the folder whose weights a new run starts from (None: random)
    plan: Plan
    prediction: Any  # simulator.Prediction
    profile: Any  # hwprofiles.HardwareProfile
    device: str
    optim: Any  # executor.optim.OptimConfig
    data: Any  # data.TokenSource
    evals: Any  # trainer.EvalSchedule | None
    checkpoints: Any  # train_state.CheckpointSchedule | None
    saves: Any  # model_saves.ModelSaves | None
    tokenizer: Path | None
    nvme_checkpoint_copies: int
    ranks: Ranks = SINGLE  # this process's place among the run's ranks

    def trainer(self):
        """The Trainer of this run (allocates the plan's memory): on a run of several ranks,
        this rank's, on its own GPU and NVMe folders."""
        from layerslide.executor.nvme import NvmeSpaceError
        from layerslide.training.distributed import rank_folders
        from layerslide.training.trainer import Trainer

        c, several = self.config, self.ranks.world > 1
        if several and self.device.startswith("cuda"):
            import torch
            torch.cuda.set_device(self.device)  # NCCL's collectives run on the current device
        # (a Trainer that predates ranks takes none: a run of one rank passes none)
        ranks = {"ranks": self.ranks} if several else {}
        try:
            trainer = Trainer(config=self.hf_config, plan=self.plan, optim=self.optim,
                              device=self.device, serial=c.serial,
                              segment_steps=c.segment_steps, gpu_memory_bytes=c.gpu_memory,
                              keep_trace=bool(c.trace_out),
                              nvme_dir=c.nvme_dir and rank_folders(c.nvme_dir, self.ranks),
                              nvme_checkpoint_copies=self.nvme_checkpoint_copies, **ranks)
        except NvmeSpaceError as err:
            raise RunError(str(err)) from err
        trainer.checkpointing.copy_ram_bytes = c.checkpoint_copy_ram
        return trainer


def prepare(config: RunConfig, *, say: Callable[[str], None] = _stderr, ranks: Ranks = SINGLE,
            rank_cores: int | None = None) -> Run:
    """Resolve and check everything a run needs, in the order a user fixes it (say: where
    notes go). A config with `resume` continues that run with its recorded settings. ranks:
    this process's place in the launch (its gpus and hosts are the run's); rank_cores: the
    CPU cores its kernels may take, on a run of several ranks. A refused run leaves no
    --checkpoint-dir it made behind (the checks open its store before they end)."""
    fresh = (Path(config.checkpoint_dir).expanduser() if config.checkpoint_dir
             and not Path(config.checkpoint_dir).expanduser().exists() else None)
    try:
        return _prepare(config, say, ranks, rank_cores)
    except RunError:
        if fresh is not None:
            with contextlib.suppress(OSError):  # not empty, or another rank's took it
                fresh.rmdir()
        raise


def _prepare(config: RunConfig, say: Callable[[str], None], ranks: Ranks,
             rank_cores: int | None) -> Run:
    import torch

    from layerslide.executor.optim import OptimConfig
    from layerslide.training.output_space import check_output_space, output_needs

    if config.resume:
        from layerslide.training.resume import resumed
        config = resumed(config, say)
    elif not config.model:
        raise RunError("--model is required (or --resume DIR to continue a run)")
    config = inputs.with_ranks(config, ranks)
    inputs.check_outputs(config)
    saves = _model_saves(config)
    device = inputs.rank_device(inputs.device_of(config.device, torch), ranks, torch)
    spec, hf_config, folder = _model(config)
    from_folder = folder is not None
    inputs.check_schedule_flags(config)
    config = replace(config, data=inputs.data_of(config, from_folder and not config.random_init))
    inputs.refuse_options_that_would_not_act(config)
    inputs.check_eval_flags(config)
    config = _own_checkpoint_dir(config, say)
    checkpoints = _checkpoint_schedule(config, hf_config)
    config, plan, drives = _plan(config, spec)
    plan = with_rank_threads(plan, rank_cores)
    profile = _for_the_ranks(_profile_of(config.profile, drives), plan.train, say)
    prediction = check_fits(plan, profile, config.gpu_memory, on_cpu=device.startswith("cpu"))
    plan, prediction = with_lanes_first(config, plan, prediction, profile, device, say)
    tokenizer = Path(config.tokenizer).expanduser() if config.tokenizer else (
        folder if from_folder else None)
    check_output_space(output_needs(config, plan, tokenizer=tokenizer,
                                    predicted_step_s=prediction.step_s,
                                    start=_progress(config, checkpoints, saves)))
    if config.nvme_dir and not plan.policy.residency.uses_nvme:
        say(f"note: --nvme-dir {config.nvme_dir}: this plan keeps nothing on NVMe (no "
            "--moments-on-nvme, --master-on-nvme, --weights-on-nvme or --activations nvme), "
            "so the folder is not used")
    if not config.out:
        say("note: no --out: the trained model will not be saved")
    optim = OptimConfig(lr=config.lr, weight_decay=config.weight_decay,
                        warmup_steps=config.warmup_steps, min_lr_ratio=config.min_lr_ratio,
                        decay_steps=max(1, config.steps - config.warmup_steps))
    data, evals = inputs.data_sources(config, spec, plan.train, tokenizer)
    return Run(config=config, spec=spec, hf_config=hf_config,
               weights=_weights(config, folder), plan=plan,
               prediction=prediction, profile=profile, device=device, optim=optim, data=data,
               evals=evals, checkpoints=checkpoints, saves=saves, tokenizer=tokenizer,
               nvme_checkpoint_copies=_checkpoints_beside(config, checkpoints), ranks=ranks)


def _progress(config: RunConfig, checkpoints, saves):
    """Where a run starts (output_space.Progress): a resumed one after its newest checkpoint,
    beside its checkpoints and saves (rotated as it goes on)."""
    from layerslide.training.output_space import Progress

    if not config.resume:
        return Progress()
    from layerslide.training.rank_checkpoints import saved_steps

    kept = saved_steps(checkpoints.store)  # one rank's, or several ranks' slices of each step
    return Progress(steps_done=kept[0].step if kept else 0, checkpoints=len(kept),
                    saves=len(saves.existing()) if saves is not None else 0)


def _model(config: RunConfig):
    """The model's spec and HF config, its folder's files checked (every shard's header
    before any allocation), and that folder (None for a preset, or a config.json): --model's,
    or a Hub id's snapshot in huggingface_hub's cache (downloaded if need be; its config alone
    with --random-init)."""
    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.training.hf_io import checkpoint_tensor_index, read_hf_config

    folder, spec = Path(config.model).expanduser(), None
    if hub.is_model_id(config.model):  # all but the weights, which come once all is checked
        folder = hub.model_folder(config.model, hub.MODEL_FILES_BUT_WEIGHTS)
        spec = replace(resolve_model(folder), name=hub.model_name(config.model))
    inputs.refuse_config_file_of_weights(config, folder)
    spec = spec or resolve_model(config.model)
    if not folder.is_dir():
        return spec, hf_config_from_spec(spec), None
    from transformers import AutoConfig
    read_hf_config(folder)  # supported architecture, readable JSON
    hf_config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if not config.random_init and not hub.is_model_id(config.model):
        checkpoint_tensor_index(folder)
    return spec, hf_config, folder


def _weights(config: RunConfig, folder: Path | None) -> Path | None:
    """The folder whose weights the run starts from (None: random ones); a Hub id's weights
    are fetched here, once everything else is checked, and every shard's header read."""
    if folder is None or config.random_init:
        return None
    if hub.is_model_id(config.model):
        from layerslide.training.hf_io import checkpoint_tensor_index

        folder = hub.model_folder(config.model, hub.MODEL_FILES)
        checkpoint_tensor_index(folder)
    return folder


def _plan(config: RunConfig, spec: ModelSpec) -> tuple[RunConfig, Plan, int | None]:
    """The plan to run: the --plan file as it is (the config then takes its GPU cap and, unless
    --profile was given, the profile and drive count it was tuned for), or one built from the
    settings."""
    from layerslide.planner.build import build_repeatable_plan

    if not config.plan:
        policy = with_environment(config.policy)
        refuse_policy_options_that_would_not_act(config.train, policy, config.given,
                                                 config.flag)
        return config, build_repeatable_plan(spec, config.train, policy), None
    plan = Plan.load(config.plan)
    shape = {k: v for k, v in plan.model.to_dict().items() if k != "name"}
    if shape != {k: v for k, v in spec.to_dict().items() if k != "name"}:
        raise RunError(f"{config.plan} is a plan for {plan.model.name}, not for {config.model}: "
                       f"tune for this model (`layerslide tune --model {config.model} -o ...`)")
    refuse_a_plan_for_other_ranks(plan, config.plan, config.train)
    refuse_options_a_plan_replaces(plan, config.plan, config.given, config.option, config.flag)
    if config.gpu_memory is None:  # a tuned plan fits the cap it was tuned for: keep to it
        config = replace(config, gpu_memory=plan.meta.get("gpu_memory_bytes"))
    tuned_for, drives = plan.meta.get("tuned_for_profile"), None
    if tuned_for and "profile" not in config.given:
        # predicted, checked and recorded on the machine it was tuned for, as simulate does
        try:
            _profile_of(tuned_for, None)
        except (ValueError, OSError) as err:
            raise RunError(f"{config.plan} was tuned for profile {tuned_for}, which is not found "
                           f"here ({err}): pass --profile with its file") from err
        config, drives = replace(config, profile=tuned_for), plan.meta.get("tuned_for_nvme_drives")
    return config, replace(plan, policy=with_environment(plan.policy)), drives


def _for_the_ranks(profile, train, say):
    """The profile this run is predicted on: as given, or holding the launch's ranks where it
    describes fewer GPUs or hosts, said with what that assumed."""
    ranked, assumed = profile.with_ranks(train.gpus, train.hosts)
    if assumed:
        say(f"note: profile {profile.name} describes {profile.host.gpus} GPU(s) of one host; "
            f"this run's {train.ranks} ranks are predicted on it assuming "
            f"{' and '.join(assumed)}: pass --profile for a machine like this one (layerslide "
            "profiles lists several-GPU ones) for a closer prediction")
    return ranked


def _profile_of(name: str, drives: int | None):
    from layerslide.hwprofiles import resolve_profile

    profile = resolve_profile(name)
    return profile if drives is None else profile.with_overrides(nvme_drives=drives)


def _model_saves(config: RunConfig):
    """The --save-every schedule (None without it), its folders checked before work."""
    from layerslide.training.model_saves import ModelSaves

    if config.save_every is None:
        return None
    if not config.out:
        raise RunError("--save-every saves beside --out: give --out")
    saves = ModelSaves(config.out, config.save_every, config.keep_saves)
    if config.save_every >= config.steps:  # saves come before the last step, never at it
        raise RunError(f"{config.flag('save_every')} {config.save_every} would never save: "
                       f"saves come every {config.save_every} steps before the last of --steps "
                       f"{config.steps}, whose model goes to --out: give --save-every below "
                       f"{config.steps}, or drop it")
    if config.resume:  # a resumed run's earlier saves are its own
        saves.adopt_existing()
    else:
        saves.check_free(config.steps, config.overwrite)
    return saves


def _json_config(hf_config) -> dict:
    """An HF config as config.json holds it (what Trainer.save writes)."""
    import json

    config = hf_config.to_dict()
    config.pop("_attn_implementation_autoset", None)
    return json.loads(json.dumps(config, default=str))


def _checkpoints_beside(config: RunConfig, schedule) -> int:
    """Checkpoints kept on the NVMe folder's filesystem: each one keeps a copy of the NVMe
    state once training has replaced the files it linked."""
    if schedule is None or not config.nvme_dir:
        return 0

    def device_of(path: Path) -> int:
        path = path.expanduser().resolve()
        while not path.exists():
            path = path.parent
        return path.stat().st_dev

    from layerslide.executor.nvme import nvme_folders

    same = any(device_of(folder) == device_of(schedule.store.root)
               for folder in nvme_folders(config.nvme_dir))
    return config.keep_checkpoints if same else 0


def _own_checkpoint_dir(config: RunConfig, say) -> RunConfig:
    """A rerun from a run's layerslide-train.toml ("same settings, longer") names that run's
    --checkpoint-dir: its own checkpoints go to a fresh folder beside it, said, never among
    the other run's (a --checkpoint-dir typed on the command line is taken as it is)."""
    from layerslide.training.checkpoint_store import holds_checkpoints

    if config.resume or "checkpoint_dir" not in config.from_config:
        return config
    taken = Path(config.checkpoint_dir).expanduser()
    if not holds_checkpoints(taken):
        return config
    n = 2
    while holds_checkpoints(f"{taken}-{n}"):
        n += 1
    say(f"note: --checkpoint-dir {taken} (in --config {config.config}) holds the checkpoints of "
        f"the run that file records: this run writes its own to {taken}-{n} (pass "
        "--checkpoint-dir to choose another)")
    return replace(config, checkpoint_dir=f"{taken}-{n}")


def _checkpoint_schedule(config: RunConfig, hf_config):
    """The CheckpointSchedule the options ask for (None without --checkpoint-dir); it stores
    the config, paths absolute, for a resume to read back, and the model's HF config, for an
    export to write beside its weights."""
    from layerslide.training.checkpoint_store import CheckpointError, CheckpointStore
    from layerslide.training.train_state import CheckpointSchedule

    if config.checkpoint_copy_ram is not None and (not config.checkpoint_dir
                                                   or config.checkpoint_sync):
        raise RunError("--checkpoint-copy-ram sizes the copies of checkpoints written beside "
                       "training: it needs --checkpoint-dir, and not --checkpoint-sync")
    if not config.checkpoint_dir:
        if config.checkpoint_every or config.checkpoint_minutes:
            raise RunError("--checkpoint-every/--checkpoint-minutes need --checkpoint-dir")
        return None
    if config.keep_checkpoints < 1:
        raise RunError(f"--keep-checkpoints {config.keep_checkpoints}: keep at least 1")
    try:
        store = CheckpointStore(config.checkpoint_dir, keep_last=config.keep_checkpoints)
        if not config.resume and store.holds_checkpoints():  # two runs' steps would interleave
            raise RunError(f"--checkpoint-dir {config.checkpoint_dir} holds another run's "
                           "checkpoints: continue that run with `layerslide train --resume "
                           f"{config.checkpoint_dir}`, or give this run an empty folder")
        return CheckpointSchedule(store=store, every_steps=config.checkpoint_every,
                                  every_minutes=config.checkpoint_minutes,
                                  meta={"args": with_absolute_paths(config.options()),
                                        "hf_config": _json_config(hf_config)},
                                  background=not config.checkpoint_sync)
    except CheckpointError as err:
        raise RunError(str(err)) from err
