"""`prepare(config) -> Run`: a RunConfig resolved into what runs, every input checked before
any weight is allocated: the outputs, the model folder, the data, the plan (a --plan file as
it is, or one built from the settings) and its fit on this machine, the checkpoint schedule.
Errors are RunErrors (ValueErrors) whose message says what to change."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from layerslide import hub
from layerslide.planner.model import ModelSpec, resolve_model
from layerslide.planner.plan import STEADY_STEPS, Plan
from layerslide.planner.settings import LANES_FIRST_NICE
from layerslide.training import inputs
from layerslide.training.run import RunConfig, RunError, with_absolute_paths, with_environment

GIB = 1024**3

# what to change when a tier's need exceeds its limit, by tier (simulate and train say it)
FIT_HINTS = {
    "gpu": "lower --micro-batch or --window, keep activations off the GPU (--activations host), "
           "or let `layerslide tune` pick settings that fit",
    "host": "keep part of the state on NVMe (--moments-on-nvme/--master-on-nvme, fractions 0-1; "
            "train needs --nvme-dir), checkpoints too (--activations nvme), or let "
            "`layerslide tune` place it",
    "nvme": "keep less on NVMe (lower the --*-on-nvme fractions), stripe over more drives "
            "(--nvme-drives), or take a profile with a larger drive",
}


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

    def trainer(self):
        """The Trainer of this run (allocates the plan's memory)."""
        from layerslide.executor.nvme import NvmeSpaceError
        from layerslide.training.trainer import Trainer

        c = self.config
        try:
            trainer = Trainer(config=self.hf_config, plan=self.plan, optim=self.optim,
                              device=self.device, serial=c.serial,
                              segment_steps=c.segment_steps, gpu_memory_bytes=c.gpu_memory,
                              keep_trace=bool(c.trace_out), nvme_dir=c.nvme_dir,
                              nvme_checkpoint_copies=self.nvme_checkpoint_copies)
        except NvmeSpaceError as err:
            raise RunError(str(err)) from err
        trainer.checkpointing.copy_ram_bytes = c.checkpoint_copy_ram
        return trainer


def prepare(config: RunConfig, *, say: Callable[[str], None] = _stderr) -> Run:
    """Resolve and check everything a run needs, in the order a user fixes it (say: where
    notes go). A config with `resume` continues that run with its recorded settings."""
    import torch

    from layerslide.executor.optim import OptimConfig

    if config.resume:
        from layerslide.training.resume import resumed
        config = resumed(config, say)
    elif not config.model:
        raise RunError("--model is required (or --resume DIR to continue a run)")
    inputs.check_outputs(config)
    saves = _model_saves(config)
    device = inputs.device_of(config.device, torch)
    spec, hf_config, folder = _model(config)
    from_folder = folder is not None
    inputs.check_schedule_flags(config)
    config = replace(config, data=inputs.data_of(config, from_folder and not config.random_init))
    inputs.refuse_options_that_would_not_act(config)
    inputs.check_eval_flags(config)
    checkpoints = _checkpoint_schedule(config)
    config, plan, drives = _plan(config, spec)
    profile = _profile_of(config.profile, drives)
    prediction = check_fits(plan, profile, config.gpu_memory)
    plan, prediction = _lanes_first(config, plan, prediction, profile, device, say)
    if config.nvme_dir and not plan.policy.residency.uses_nvme:
        say(f"note: --nvme-dir {config.nvme_dir}: this plan keeps nothing on NVMe (no "
            "--moments-on-nvme, --master-on-nvme, --weights-on-nvme or --activations nvme), "
            "so the folder is not used")
    if not config.out:
        say("note: no --out: the trained model will not be saved")
    optim = OptimConfig(lr=config.lr, weight_decay=config.weight_decay,
                        warmup_steps=config.warmup_steps, min_lr_ratio=config.min_lr_ratio,
                        decay_steps=max(1, config.steps - config.warmup_steps))
    tokenizer = Path(config.tokenizer).expanduser() if config.tokenizer else (
        folder if from_folder else None)
    data, evals = inputs.data_sources(config, spec, plan.train, tokenizer)
    return Run(config=config, spec=spec, hf_config=hf_config,
               weights=_weights(config, folder), plan=plan,
               prediction=prediction, profile=profile, device=device, optim=optim, data=data,
               evals=evals, checkpoints=checkpoints, saves=saves, tokenizer=tokenizer,
               nvme_checkpoint_copies=_checkpoints_beside(config, checkpoints))


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


def _profile_of(name: str, drives: int | None):
    from layerslide.hwprofiles import resolve_profile

    profile = resolve_profile(name)
    return profile if drives is None else profile.with_overrides(nvme_drives=drives)


def refuse_options_a_plan_replaces(plan: Plan, plan_file: str, given, value, flag, *,
                                   also: dict[str, object] | None = None) -> None:
    """A --plan file's training settings and policy replace those options: refuse one given
    (the names in `given`; value(name) and flag(name) say it) with another value than the
    plan's, rather than drop it unsaid (a --max-grad-norm that would not clip). also: more
    options the plan decides, with the plan's value."""
    planned = {**plan.train.to_dict(), **plan.policy.flat(), **(also or {})}
    clashes = [f"{flag(name)} {value(name)} (the plan has {planned[name]})"
               for name in sorted(given) if name in planned and value(name) != planned[name]]
    if clashes:
        raise RunError(f"--plan {plan_file} sets the training settings and policy, so these "
                       f"would be ignored: {'; '.join(clashes)}. Drop them, make the plan "
                       "with them (`layerslide tune` takes --seq-len and --max-grad-norm), or "
                       "give the flags without --plan to build the plan from them")


def refuse_policy_options_that_would_not_act(train, policy, given, flag) -> None:
    """Refuse a policy option given (its name in `given`, said as flag(name)) where the rest of
    the plan leaves it nothing to change: said with what it needs, rather than planned as if
    it did something."""
    s = policy.schedule
    idle = {
        "cast_worker": (s.cast_worker and not policy.cpu_casts,
                        (f"there are no CPU cast tasks to give a worker (--cast {s.cast} with "
                         f"--cpu-optimizer {policy.kernels.cpu_optimizer}); --cast "
                         "cpu_per_load, or cpu_once with --cpu-optimizer torch, has them")),
        "accumulation": (train.grad_accum == 1, "it schedules --grad-accum above 1"),
        "sweep_groups": (train.grad_accum == 1 or s.accumulation != "layer_major",
                         ("it groups a layer_major sweep (--accumulation layer_major with "
                          "--grad-accum above 1)")),
        "gpu_updated_order": (policy.residency.gpu_updated_blocks == 0,
                              "it orders --gpu-updated-blocks, and there are none"),
    }
    for name, (inert, why) in idle.items():
        if name in given and inert:
            raise RunError(f"{flag(name)} would change nothing here: {why}; drop it")


def check_fits(plan: Plan, profile, gpu_memory: int | None, *, warn: bool = True):
    """Refuse a plan whose predicted memory exceeds the GPU cap or this machine's RAM; the
    prediction (on the profile) that says it fits. warn: say where RAM is tight."""
    from layerslide.calibrate.host import physical_ram_bytes
    from layerslide.simulator.predict import simulate

    if plan.num_steps < STEADY_STEPS:  # to simulate a steady step: the plan's last, repeated
        plan = plan.unroll(STEADY_STEPS)
    prediction = simulate(plan, profile, gpu_memory_bytes=gpu_memory)
    gpu_need = prediction.gpu_need_bytes  # the allocator's reserve, not only the allocated peak
    if gpu_memory is not None and gpu_need > gpu_memory:
        raise RunError(f"the plan needs {gpu_need / GIB:.2f} GiB of GPU memory (what the "
                       "allocator reserves for it), more than "
                       f"--gpu-memory {gpu_memory / GIB:.2f} GiB: {FIT_HINTS['gpu']}")
    ram = physical_ram_bytes()
    host_need = max(plan.static_bytes("host"), prediction.peak_bytes.get("host", 0))
    reserve = profile.host.reserve_bytes
    if warn and ram - reserve < host_need <= ram:  # a machine whose RAM grows may hold it
        _stderr(f"warning: the plan needs {host_need / GIB:.1f} GiB of host memory at its peak, "
                f"within {reserve / GIB:.0f} GiB of this machine's {ram / GIB:.1f} GiB "
                "(the OS and the CUDA driver need some): the OOM killer may stop it")
    if host_need > ram:
        raise RunError(f"the plan needs {host_need / GIB:.1f} GiB of host memory at its peak, "
                       f"this machine has {ram / GIB:.1f} GiB: {FIT_HINTS['host']}")
    return prediction


def _lanes_first(config: RunConfig, plan: Plan, prediction, profile, device: str, say):
    """The plan with its CPU kernels niced where it is GPU-bound (tuner.lanes_first), built
    from the settings (a --plan file runs as it is), runs on a GPU (on the CPU its compute is
    no launch to let through) and LAYERSLIDE_CPU_NICE leaves the choice open; and its
    prediction, simulated again where the profile prices niced launches apart."""
    from layerslide.tuner.lanes_first import chosen_in_environment, niced_where_gpu_bound

    if config.plan or chosen_in_environment() or not device.startswith("cuda"):
        return plan, prediction

    def fitting(policy):
        try:
            return check_fits(replace(plan, policy=policy), profile, config.gpu_memory,
                              warn=False)
        except RunError:
            return None
    found = niced_where_gpu_bound(plan.policy, prediction, profile, fitting)
    if found is None:
        return plan, prediction
    say(f"the plan is GPU-bound: the CPU optimizer's workers run at nice {LANES_FIRST_NICE}, "
        "so that the GPU's launches take a core first (LAYERSLIDE_CPU_NICE=0 keeps them at 0)")
    return replace(plan, policy=found[0]), found[1]


def _model_saves(config: RunConfig):
    """The --save-every schedule (None without it), its folders checked before work."""
    from layerslide.training.model_saves import ModelSaves

    if config.save_every is None:
        return None
    if not config.out:
        raise RunError("--save-every saves beside --out: give --out")
    saves = ModelSaves(config.out, config.save_every, config.keep_saves)
    if config.resume:  # a resumed run's earlier saves are its own
        saves.adopt_existing()
    else:
        saves.check_free(config.steps, config.overwrite)
    return saves


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


def _checkpoint_schedule(config: RunConfig):
    """The CheckpointSchedule the options ask for (None without --checkpoint-dir); it stores
    the config, paths absolute, for a resume to read back."""
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
                                  meta={"args": with_absolute_paths(config.options())},
                                  background=not config.checkpoint_sync)
    except CheckpointError as err:
        raise RunError(str(err)) from err
