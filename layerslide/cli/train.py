"""`layerslide train`: fine-tune a Hugging Face model with the executor.

Everything that can be wrong with the input (folder, architecture, plan for another model, data,
a GPU cap or host RAM too small for the plan) is refused before any weight is allocated.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from layerslide.cli.options import (
    UsageError,
    add_policy,
    add_train,
    byte_size,
    byte_size_or_zero,
    flag_of,
    gib,
    plan_settings,
    policy_of,
    profile_of,
    train_of,
    with_env_overrides,
)
from layerslide.cli.refusals import (
    FIT_HINTS,
    refuse_flags_a_plan_replaces,
    refuse_policy_flags_that_would_not_act,
)
from layerslide.cli.run_config import (
    RESOLVED_NAME,
    with_absolute_paths,
    with_run_config,
    write_resolved,
)
from layerslide.cli.step_logs import StepReporter
from layerslide.cli.train_inputs import (
    check_eval_flags,
    check_outputs,
    check_schedule_flags,
    data_of,
    data_sources,
    device_of,
    refuse_config_file_of_weights,
    refuse_options_that_would_not_act,
)
from layerslide.planner.build import build_repeatable_plan
from layerslide.planner.model import ModelSpec, resolve_model
from layerslide.planner.plan import STEADY_STEPS, Plan
from layerslide.planner.settings import LANES_FIRST_NICE, STATE_LAYOUT_FIELDS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "special_tokens_map.json", "generation_config.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json")


# the AdamW rate a run kept, off the profile's by more than this, is worth a refined profile
REFINE_HINT_ERROR = 0.05


def add_train_command(sub, units: str) -> None:
    help = "fine-tune a Hugging Face model (or a preset with random weights) on this machine"
    p = sub.add_parser("train", help=help, description=help, epilog=units)
    p.add_argument("--config", metavar="FILE",
                   help="a TOML file of train options (named as the flags, without dashes: "
                        "micro-batch = 8); flags given here override it; the options a run "
                        f"used are written to --out as {RESOLVED_NAME}")
    p.add_argument("--model",
                   help="a Hugging Face model folder (config.json + safetensors), or a preset "
                        "name for random weights (benchmarks); required unless --resume")
    p.add_argument("--plan", help="a plan file from `layerslide tune -o`: its training settings "
                                   "and policy replace the flags below")
    p.add_argument("--data",
                   help="a .jsonl/.json/.parquet/.arrow/.txt file, a folder of them or a saved "
                        "dataset, or 'synthetic' (random tokens; the default for a preset or "
                        "--random-init, never for a folder's weights)")
    p.add_argument("--data-format", default="auto",
                   help="the records' format: text, messages (or sharegpt conversations; "
                        "rendered with the tokenizer's chat template), alpaca or "
                        "prompt_completion (default: from the records' fields)")
    p.add_argument("--text-field", default="text", help="the field text records hold")
    p.add_argument("--packing", choices=("auto", "on", "off"), default="auto",
                   help="pack examples into full rows, each attending only to itself (on), "
                        "or one example a row, padded (off); auto: on for text, off for "
                        "chat-like data")
    p.add_argument("--attend-across-documents", action="store_true",
                   help="packed rows: let attention cross example boundaries (plain causal "
                        "attention, the fastest kernel) instead of a document mask")
    p.add_argument("--train-on-prompt", action="store_true",
                   help="train on every token of chat-like data, not only the replies")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the model folder)")
    p.add_argument("--eval-data", help="held-out data (as --data, in the same format) to score "
                                       "the model on: eval loss and next-token accuracy")
    p.add_argument("--eval-fraction", type=float, default=None, metavar="F",
                   help="hold out this fraction (0-1) of --data's examples as the eval data")
    p.add_argument("--eval-every", type=int, default=None, metavar="STEPS",
                   help="score the eval data every this many steps (and after the last; "
                        "default: after the last only)")
    p.add_argument("--eval-rows", type=int, default=256, metavar="N",
                   help="rows of the eval data scored each time (its first N)")
    p.add_argument("--out", help="folder to save the fine-tuned model in (HF format)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--save-every", type=int, default=None, metavar="STEPS",
                   help="also save the model every this many steps, as OUT-step-N beside --out")
    p.add_argument("--keep-saves", type=int, default=2, metavar="K",
                   help="keep the newest K of the --save-every folders")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps to train")
    p.add_argument("--lr", type=float, default=1e-5, help="peak learning rate")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW decoupled decay")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="cosine decay ends at lr * this after --steps")
    p.add_argument("--gpu-memory", type=byte_size, default=None, metavar="SIZE",
                   help="cap this process's GPU memory, e.g. 24GiB (default: the cap a tuned "
                        "--plan was made for)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--serial", action="store_true",
                   help="run one task at a time (the correctness oracle; slow)")
    p.add_argument("--segment-steps", type=int, default=16,
                   help="steps per plan segment (the pipeline drains between segments)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and data")
    p.add_argument("--random-init", action="store_true",
                   help="random weights even when --model is a folder with weights")
    p.add_argument("--nvme-dir", help="folder on the NVMe drive for the state the policy keeps "
                                      "there (--moments-on-nvme, ...), or several, comma-"
                                      "separated, one per drive: each file is striped over them")
    p.add_argument("--trace-out", help="write the measured trace (layerslide JSON) here")
    p.add_argument("--log-jsonl", help="append one JSON line per step here (step: 1 for the "
                                       "first, as on stdout)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="write TensorBoard event files of each step's loss, lr, grad norm, "
                        "speed and memory into DIR")
    p.add_argument("--profile", default="h200-bench",
                   help="hardware profile used to predict the plan's peak GPU memory "
                        "(default: the one a --plan was tuned for, else h200-bench)")
    g = p.add_argument_group("checkpoints of the full training state (weights, AdamW moments, "
                             "step, data position)")
    g.add_argument("--checkpoint-dir", help="write checkpoints here (atomic, checksummed)")
    g.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint every this many steps (and at the end)")
    g.add_argument("--checkpoint-minutes", type=float, default=None, metavar="MIN",
                   help="checkpoint once this many minutes have passed since the last one")
    g.add_argument("--checkpoint-sync", action="store_true",
                   help="pause training while a checkpoint is written (default: written "
                        "beside the next steps, each block's part before its next update)")
    g.add_argument("--checkpoint-copy-ram", type=byte_size_or_zero, default=None, metavar="SIZE",
                   help="at most this much RAM for the copies a checkpoint beside training "
                        "makes of the state, kept for the run (default: what the machine has "
                        "free beyond 8 GiB; 0: none, each update waits for its block's write)")
    g.add_argument("--keep-checkpoints", type=int, default=2, metavar="K",
                   help="keep the newest K complete checkpoints")
    g.add_argument("--resume", metavar="DIR",
                   help="continue the run whose checkpoints are in DIR from its newest good "
                        "one; the run's settings come from the checkpoint, except that the "
                        "training settings and policy flags (but --seq-len and the NVMe "
                        "fractions), --plan and --gpu-memory may give it a new schedule, and "
                        "--device, --serial, --trace-out, --log-jsonl, --tensorboard and "
                        "--resume-fallback "
                        "apply; other flags are ignored")
    g.add_argument("--resume-fallback", action="store_true",
                   help="if the newest checkpoint fails its checksums, resume from the one "
                        "before it instead of stopping")
    add_train(p)
    add_policy(p, plan_steps=False)
    p.set_defaults(run=cmd_train, parser_defaults=_defaults_of(p),
                   reschedulable=_reschedulable(p), train_parser=p)


def _defaults_of(parser) -> dict:
    """Each option's default, to tell the flags a user gave from those left alone."""
    return {a.dest: a.default for a in parser._actions if a.dest != "help"}


def _reschedulable(parser) -> tuple[str, ...]:
    """The options a resumed run may change: how the steps are scheduled, not what the state
    means or where on the drive its parts lie (the sequence length positions the data)."""
    names = set(plan_settings(parser))
    return tuple(sorted((names - {"seq_len", *STATE_LAYOUT_FIELDS})
                        | {"plan", "gpu_memory", "segment_steps"}))


def _plan(args, spec: ModelSpec) -> Plan:
    """The plan to run: the --plan file as it is, or one built from the flags."""
    if not args.plan:
        train, policy = train_of(args), policy_of(args)
        refuse_policy_flags_that_would_not_act(args, train, policy)
        return build_repeatable_plan(spec, train, policy)
    plan = Plan.load(args.plan)
    shape = {k: v for k, v in plan.model.to_dict().items() if k != "name"}
    if shape != {k: v for k, v in spec.to_dict().items() if k != "name"}:
        raise UsageError(f"{args.plan} is a plan for {plan.model.name}, not for {args.model}: "
                         f"tune for this model (`layerslide tune --model {args.model} -o ...`)")
    refuse_flags_a_plan_replaces(args, args.train_parser, plan)
    if args.gpu_memory is None:  # a tuned plan fits the cap it was tuned for: keep to it
        args.gpu_memory = plan.meta.get("gpu_memory_bytes")
    tuned_for = plan.meta.get("tuned_for_profile")
    if tuned_for and "profile" not in getattr(args, "given", frozenset()):
        # predicted, checked and recorded on the machine it was tuned for, as simulate does
        try:
            profile_of(tuned_for)
        except (UsageError, ValueError, OSError) as err:
            raise UsageError(f"{args.plan} was tuned for profile {tuned_for}, which is not found "
                             f"here ({err}): pass --profile with its file") from err
        args.profile = tuned_for
        args.profile_drives = plan.meta.get("tuned_for_nvme_drives")
    return replace(plan, policy=with_env_overrides(plan.policy))


def _profile(args):
    """The profile the run is predicted on: --profile, or the one its plan was tuned for (with
    the drive count it was tuned with)."""
    return profile_of(args.profile, getattr(args, "profile_drives", None))


def _check_fits(args, plan: Plan, *, warn: bool = True):
    """Refuse a plan whose predicted memory exceeds the GPU cap or this machine's RAM; the
    prediction (on --profile) that says it fits. warn: say where RAM is tight."""
    from layerslide.calibrate.host import physical_ram_bytes
    from layerslide.simulator.predict import simulate

    if plan.num_steps < STEADY_STEPS:  # to simulate a steady step: the plan's last, repeated
        plan = plan.unroll(STEADY_STEPS)
    profile = _profile(args)
    prediction = simulate(plan, profile, gpu_memory_bytes=args.gpu_memory)
    gpu_need = prediction.gpu_need_bytes  # the allocator's reserve, not only the allocated peak
    if args.gpu_memory is not None and gpu_need > args.gpu_memory:
        raise UsageError(f"the plan needs {gib(gpu_need):.2f} GiB of GPU memory (what the "
                         "allocator reserves for it), more than "
                         f"--gpu-memory {gib(args.gpu_memory):.2f} GiB: {FIT_HINTS['gpu']}")
    ram = physical_ram_bytes()
    host_need = max(plan.static_bytes("host"), prediction.peak_bytes.get("host", 0))
    reserve = profile.host.reserve_bytes
    if warn and ram - reserve < host_need <= ram:  # a machine whose RAM grows may hold it
        print(f"warning: the plan needs {gib(host_need):.1f} GiB of host memory at its peak, "
              f"within {gib(reserve):.0f} GiB of this machine's {gib(ram):.1f} GiB "
              "(the OS and the CUDA driver need some): the OOM killer may stop it",
              file=sys.stderr)
    if host_need > ram:
        raise UsageError(f"the plan needs {gib(host_need):.1f} GiB of host memory at its peak, "
                         f"this machine has {gib(ram):.1f} GiB: {FIT_HINTS['host']}")
    return prediction


def _lanes_first(args, plan: Plan, prediction, device: str):
    """The plan with its CPU kernels niced where it is GPU-bound (tuner.lanes_first), built
    from the flags (a --plan file runs as it is), runs on a GPU (on the CPU its compute is no
    launch to let through) and LAYERSLIDE_CPU_NICE leaves the choice open; and its
    prediction, simulated again where the profile prices niced launches apart."""
    from layerslide.tuner.lanes_first import chosen_in_environment, niced_where_gpu_bound

    if args.plan or chosen_in_environment() or not device.startswith("cuda"):
        return plan, prediction

    def fitting(policy):
        try:
            return _check_fits(args, replace(plan, policy=policy), warn=False)
        except UsageError:
            return None
    found = niced_where_gpu_bound(plan.policy, prediction, _profile(args), fitting)
    if found is None:
        return plan, prediction
    print(f"the plan is GPU-bound: the CPU optimizer's workers run at nice {LANES_FIRST_NICE}, "
          "so that the GPU's launches take a core first (LAYERSLIDE_CPU_NICE=0 keeps them at 0)")
    return replace(plan, policy=found[0]), found[1]


# what a resumed run may change: how it runs, not what it computes
RUNTIME_ONLY = ("device", "serial", "trace_out", "log_jsonl", "tensorboard", "resume",
                "resume_fallback", "checkpoint_copy_ram",
                "run", "command", "parser_defaults", "reschedulable", "train_parser", "argv",
                "given")


def _resumed_args(args):
    """The arguments of the run whose checkpoints are in args.resume, with this invocation's
    runtime-only options; checkpoints keep going to that folder."""
    import argparse

    from layerslide.executor.checkpoint_store import CheckpointError, CheckpointStore

    try:
        store = CheckpointStore(args.resume)
        newest = store.latest()
    except CheckpointError as err:
        raise UsageError(str(err)) from err
    if newest is None:
        raise UsageError(f"--resume {args.resume}: no complete checkpoint there (a run writes "
                         "them with --checkpoint-dir and --checkpoint-every/--checkpoint-minutes)")
    saved = newest.meta.get("run", {}).get("args")
    if saved is None:
        raise UsageError(f"{newest.path} holds no `layerslide train` arguments to resume with")
    if newest.meta.get("step", 0) >= saved.get("steps", 0):
        where = f" (its model is in {saved['out']})" if saved.get("out") else ""
        raise UsageError(f"--resume {args.resume}: that run finished all its {saved['steps']} "
                         f"steps{where}: nothing to resume; to train on, start a new run with "
                         "--model set to its saved folder")
    defaults = getattr(args, "parser_defaults", {})
    # what this command line gives, even at a default's value, that the checkpointed run had not
    changed = {k for k in getattr(args, "given", ()) if k in defaults and k not in RUNTIME_ONLY
               and getattr(args, k) != saved.get(k)}
    rescheduled = sorted(changed & set(getattr(args, "reschedulable", ())))
    ignored = sorted(changed - set(rescheduled))
    if rescheduled:
        print("note: resuming under a new schedule: " + ", ".join(
            f"{flag_of(k)} {getattr(args, k)} (was {saved.get(k)})" for k in rescheduled),
            file=sys.stderr)
    if ignored:
        print("note: resuming with the checkpointed run's settings: "
              f"{', '.join(map(flag_of, ignored))} ignored", file=sys.stderr)
    # defaults first: options added since the checkpoint was written take them
    merged = {**defaults, **saved, **{k: getattr(args, k) for k in rescheduled},
              **{k: getattr(args, k) for k in RUNTIME_ONLY if hasattr(args, k)}}
    merged["checkpoint_dir"] = args.resume
    # what this command line gives that the resumed run takes: the rest was said ignored
    merged["given"] = set(rescheduled) | (set(getattr(args, "given", ())) & set(RUNTIME_ONLY))
    return argparse.Namespace(**merged)


def _run_args(args) -> dict:
    """The arguments to store with checkpoints, paths made absolute so that a resume from
    another working directory finds the same files."""
    return with_absolute_paths({k: v for k, v in vars(args).items()
                                if k != "run" and isinstance(v, str | int | float | bool
                                                             | type(None))})


def cmd_train(args) -> int:
    import torch
    from tqdm import tqdm

    if args.config:
        if args.resume:
            raise UsageError("--config starts a run; --resume continues one with the settings "
                             "its checkpoint keeps: give one of them")
        args = with_run_config(args, args.train_parser, args.argv[1:])
    if args.resume:
        args = _resumed_args(args)
    elif not args.model:
        raise UsageError("--model is required (or --resume DIR to continue a run)")

    from layerslide.executor.blocks import hf_config_from_spec
    from layerslide.executor.checkpoint_store import CheckpointError
    from layerslide.executor.engine import TaskFailedError
    from layerslide.executor.hf_io import checkpoint_tensor_index, read_hf_config
    from layerslide.executor.nvme import NvmeSpaceError
    from layerslide.executor.optim import OptimConfig
    from layerslide.executor.trainer import Trainer

    check_outputs(args)
    saves = _model_saves(args)
    device = device_of(args.device, torch)
    folder = Path(args.model).expanduser()
    refuse_config_file_of_weights(args, folder)
    from_folder = folder.is_dir()
    spec = resolve_model(args.model)
    if from_folder:
        from transformers import AutoConfig
        read_hf_config(folder)  # supported architecture, readable JSON
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        if not args.random_init:  # every shard's header and length, before any allocation
            checkpoint_tensor_index(folder)
    else:
        config = hf_config_from_spec(spec)
    check_schedule_flags(args)
    args.data = data_of(args, from_folder and not args.random_init)
    refuse_options_that_would_not_act(args)
    check_eval_flags(args)
    schedule = _checkpoint_schedule(args)
    plan = _plan(args, spec)
    prediction = _check_fits(args, plan)
    plan, prediction = _lanes_first(args, plan, prediction, device)
    train, policy = plan.train, plan.policy
    if args.nvme_dir and not policy.residency.uses_nvme:
        print(f"note: --nvme-dir {args.nvme_dir}: this plan keeps nothing on NVMe (no "
              "--moments-on-nvme, --master-on-nvme, --weights-on-nvme or --activations nvme), "
              "so the folder is not used", file=sys.stderr)
    if not args.out:
        print("note: no --out: the trained model will not be saved", file=sys.stderr)
    optim = OptimConfig(lr=args.lr, weight_decay=args.weight_decay,
                        warmup_steps=args.warmup_steps, min_lr_ratio=args.min_lr_ratio,
                        decay_steps=max(1, args.steps - args.warmup_steps))
    tokenizer = args.tokenizer or (folder if from_folder else None)
    data, evals = data_sources(args, spec, train, tokenizer)

    try:
        trainer = Trainer(config=config, plan=plan, optim=optim, device=device,
                          serial=args.serial, segment_steps=args.segment_steps,
                          gpu_memory_bytes=args.gpu_memory,
                          keep_trace=bool(args.trace_out),
                          nvme_dir=args.nvme_dir,
                          nvme_checkpoint_copies=_checkpoints_beside(args, schedule))
        trainer.checkpoint_copy_ram_bytes = args.checkpoint_copy_ram
    except (ValueError, NvmeSpaceError) as err:
        raise UsageError(str(err)) from err
    with trainer:
        print(f"{spec.name}: {spec.total_params / 1e9:.2f} B params on {device}; "
              f"micro-batch {train.micro_batch} x {train.seq_len} tokens x {train.grad_accum}; "
              f"window {policy.residency.window}, activations on "
              f"{policy.residency.activations}, cast {policy.schedule.cast}", flush=True)
        if args.resume:
            try:
                info = trainer.restore_state(schedule.store, data, fallback=args.resume_fallback)
            except (ValueError, OSError, CheckpointError) as err:
                raise UsageError(str(err)) from err
            print(f"resuming from {info.path} after step {trainer.step}", flush=True)
        elif from_folder and not args.random_init:
            print(f"loading weights from {folder}", flush=True)
            try:
                trainer.load_checkpoint(folder)
            except (ValueError, OSError) as err:  # OSError: writing weights kept on NVMe
                raise UsageError(str(err)) from err
        else:
            trainer.init_random(args.seed)
        if schedule is not None and schedule.background:  # RAM faulted in now, not mid-run
            kept_gb = trainer.keep_checkpoint_copies() / 1e9
            state_gb = trainer.host_updated_state_bytes / 1e9
            print(f"checkpoints beside training: {kept_gb:.1f} GB of RAM kept for copies of "
                  f"the {state_gb:.1f} GB state the host updates (updates of blocks beyond it "
                  "wait for their write)" if kept_gb < state_gb else
                  f"checkpoints beside training: {kept_gb:.1f} GB of RAM kept for copies of "
                  "the state", flush=True)
        # the bar moves as steps finish; step logs come when their segment has drained
        bar = tqdm(total=args.steps, initial=trainer.step, unit="step", file=sys.stderr,
                   dynamic_ncols=True, disable=None)
        reporter = StepReporter(args.steps, bar, jsonl_path=args.log_jsonl,
                                tensorboard_dir=args.tensorboard,
                                predicted_step_s=prediction.step_s)
        first_step = trainer.step + 1
        if not args.trace_out:  # the steps the prediction's timeline shows
            from layerslide.reports.run_check import WARMUP_STEPS
            trainer.trace_steps = trainer.step + WARMUP_STEPS + 1
        if evals is not None and trainer.step == 0:  # the score training starts from
            reporter.report_eval(trainer.evaluate(evals.batches))
        stop = GracefulStop(bar)
        # the tokenizer the run read its data with goes with the model
        tokenizer_folder = Path(tokenizer).expanduser() if tokenizer else None
        extra = {name: tokenizer_folder / name for name in TOKENIZER_FILES
                 if tokenizer_folder is not None and (tokenizer_folder / name).is_file()}

        def save_model(step: int) -> None:
            path = saves.save(trainer, step, extra, after_write=lambda saved: write_resolved(
                saved, args, args.train_parser))
            bar.write(f"saved the model after step {step} to {path}", file=sys.stdout)

        try:  # the handlers stay through the final save: a first Ctrl-C lets it finish
            try:
                logs = trainer.fit(data, args.steps - trainer.step,
                            on_step=reporter,
                            on_step_done=lambda _step: bar.update(1), checkpoints=schedule,
                            on_checkpoint=lambda info, seconds: bar.write(
                                f"checkpoint of step {info.step} in {info.path}: "
                                f"{info.total_bytes / 1e9:.2f} GB; training paused "
                                f"{seconds:.1f} s for it", file=sys.stdout), stop=stop.event,
                            evals=evals, on_eval=reporter.report_eval,
                            save_every=None if saves is None else saves.every_steps,
                            on_save=save_model)
            except (TaskFailedError, CheckpointError) as err:
                bar.close()
                print(f"layerslide train: training stopped: {err}", file=sys.stderr)
                if schedule is not None and schedule.store.latest() is not None:
                    print(f"the last complete checkpoint, {schedule.store.latest().path}, is "
                          f"intact: continue with `layerslide train --resume "
                          f"{schedule.store.root}`", file=sys.stderr)
                return 1
            finally:
                bar.close()
                reporter.close()
                if args.trace_out:
                    trainer.trace(f"{spec.name} measured").save(args.trace_out)
            if trainer.stopped:
                return _stopped(trainer, schedule, stop.signum)
            if args.out:
                stop.doing = f"the model's save to {args.out}"
                saved = trainer.save(args.out, overwrite=args.overwrite, extra_files=extra)
                if getattr(args, "train_parser", None) is not None:
                    write_resolved(saved, args, args.train_parser)
                print(f"saved the fine-tuned model to {saved}")
        finally:
            stop.restore()
        if stop.signum is not None:
            return 128 + stop.signum
        _report_prediction(args, prediction, trainer, logs, first_step)
    return 0


def _report_prediction(args, prediction, trainer, logs, first_step: int) -> None:
    """The plan's predicted step and peaks against the run's, as a line and (with --out) as
    prediction-check.json and prediction-timeline.png in the model's folder."""
    from layerslide.reports.run_check import adamw_alone_rates, check_run, write_run_check

    if not logs or prediction.step_s is None:
        return
    measured = trainer.trace(f"{trainer.spec.name} measured")
    adamw = (adamw_alone_rates(prediction.trace, measured, layer_params=trainer.spec.layer_params,
                               num_layers=trainer.spec.num_layers)
             if prediction.trace is not None else None)
    check = check_run(profile=_where_found(args.profile), predicted_step_s=prediction.step_s,
                      predicted_gpu_allocated_bytes=prediction.gpu_allocated_peak_bytes,
                      predicted_host_bytes=prediction.peak_bytes.get("host", 0),
                      step_s=[log.step_s for log in logs],
                      gpu_peak_bytes=[log.gpu_peak_bytes for log in logs],
                      host_peak_bytes=[log.host_rss_bytes for log in logs], first_step=first_step,
                      host_copies_bytes=trainer.checkpoint_copy_bytes,
                      adamw_alone_params_per_s=adamw,
                      profile_adamw_params_per_s=_profile(args).host.adamw_params_per_s)
    where = "" if trainer.device.is_cuda else " (this run is on the CPU, the profile's is a GPU)"
    print(check.line() + where)
    segment = min(every for every in (args.segment_steps, args.checkpoint_every,
                                      args.eval_every, args.save_every) if every)
    if segment <= 2:  # the simulator predicts a step in a pipeline that runs on
        print(f"note: the run drained its pipeline every {segment} step(s) (--segment-steps, "
              "--checkpoint-every, --eval-every, --save-every): each measured step holds a "
              "fill and drain that the predicted steady step leaves out")
    if args.out:
        written = write_run_check(check, args.out, predicted=prediction.trace,
                                  measured=measured)
        print(f"the prediction's check: {', '.join(str(p) for p in written)}")
        hint = refine_hint(check, args.out, on_gpu=trainer.device.is_cuda)
        if hint:
            print(hint)


def _where_found(profile: str) -> str:
    """A profile as `refine` finds it from any folder: a file by its absolute path, a
    built-in or variant by name."""
    path = Path(profile).expanduser()
    return str(path.resolve()) if path.is_file() else profile


def refine_hint(check, out: str, *, on_gpu: bool) -> str | None:
    """Where a GPU run's CPU AdamW kept a rate off its profile's by more than
    REFINE_HINT_ERROR: how to put that rate into a profile (a CPU run's says nothing of the
    GPU machine the profile describes)."""
    error = check.error("adamw_alone_params_per_s")
    if not on_gpu or error is None or abs(error) <= REFINE_HINT_ERROR:
        return None
    return (f"the CPU AdamW ran {check.measured_adamw_alone_params_per_s / 1e9:.2f} Gparam/s "
            f"where {check.profile} gives {check.predicted_adamw_alone_params_per_s / 1e9:.2f}: "
            f"`layerslide refine --from-run {out} --out REFINED.toml` writes a profile with "
            "this machine's rate for the next simulate/tune/train")


class GracefulStop:
    """SIGINT/SIGTERM during training: the first ends the run after the step in flight (and
    checkpoints it), a second exits at once (a checkpoint is written whole or not at all)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, bar):
        self.event, self.signum, self._bar = threading.Event(), None, bar
        self.doing = "the step in flight"  # what a first signal lets finish
        self._previous = {sig: signal.signal(sig, self._first) for sig in self.SIGNALS}

    def _first(self, signum, _frame) -> None:
        self.signum = signum
        self.event.set()
        for sig in self.SIGNALS:
            signal.signal(sig, self._second)
        self._bar.write(f"{signal.Signals(signum).name}: stopping after {self.doing}; "
                        "send it again to exit at once", file=sys.stderr)

    @staticmethod
    def _second(signum, _frame) -> None:
        print(f"{signal.Signals(signum).name} again: exiting now", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _stopped(trainer, schedule, signum: int | None) -> int:
    """What a stopped run says: where to resume from, or that nothing was kept; 128 + the
    signal's number, as a shell reports a run a signal ended."""
    print(f"stopped after step {trainer.step}; the model is not saved to --out", file=sys.stderr)
    if schedule is not None and schedule.store.latest() is not None:
        print(f"checkpoint {schedule.store.latest().path} holds it: continue with "
              f"`layerslide train --resume {schedule.store.root}`", file=sys.stderr)
    else:
        print("no checkpoint is kept (no --checkpoint-dir): these steps are lost",
              file=sys.stderr)
    return 128 + (signum or signal.SIGINT)


def _model_saves(args):
    """The --save-every schedule (None without it), its folders checked before work."""
    from layerslide.cli.model_saves import ModelSaves

    if args.save_every is None:
        return None
    if not args.out:
        raise UsageError("--save-every saves beside --out: give --out")
    saves = ModelSaves(args.out, args.save_every, args.keep_saves)
    if args.resume:  # a resumed run's earlier saves are its own
        saves.adopt_existing()
    else:
        saves.check_free(args.steps, args.overwrite)
    return saves


def _checkpoints_beside(args, schedule) -> int:
    """Checkpoints kept on the NVMe folder's filesystem: each one keeps a copy of the NVMe
    state once training has replaced the files it linked."""
    if schedule is None or not args.nvme_dir:
        return 0

    def device_of(path: Path) -> int:
        path = path.expanduser().resolve()
        while not path.exists():
            path = path.parent
        return path.stat().st_dev

    from layerslide.executor.nvme import nvme_folders

    same = any(device_of(folder) == device_of(schedule.store.root)
               for folder in nvme_folders(args.nvme_dir))
    return args.keep_checkpoints if same else 0


def _checkpoint_schedule(args):
    """The CheckpointSchedule the flags ask for (None without --checkpoint-dir)."""
    from layerslide.executor.checkpoint_store import CheckpointError, CheckpointStore
    from layerslide.executor.trainer import CheckpointSchedule

    if args.checkpoint_copy_ram is not None and (not args.checkpoint_dir
                                                 or args.checkpoint_sync):
        raise UsageError("--checkpoint-copy-ram sizes the copies of checkpoints written beside "
                         "training: it needs --checkpoint-dir, and not --checkpoint-sync")
    if not args.checkpoint_dir:
        if args.checkpoint_every or args.checkpoint_minutes:
            raise UsageError("--checkpoint-every/--checkpoint-minutes need --checkpoint-dir")
        return None
    if args.keep_checkpoints < 1:
        raise UsageError(f"--keep-checkpoints {args.keep_checkpoints}: keep at least 1")
    try:
        store = CheckpointStore(args.checkpoint_dir, keep_last=args.keep_checkpoints)
        if not args.resume and store.holds_checkpoints():  # two runs' steps would interleave
            raise UsageError(f"--checkpoint-dir {args.checkpoint_dir} holds another run's "
                             "checkpoints: continue that run with `layerslide train --resume "
                             f"{args.checkpoint_dir}`, or give this run an empty folder")
        return CheckpointSchedule(store=store, every_steps=args.checkpoint_every,
                                  every_minutes=args.checkpoint_minutes,
                                  meta={"args": _run_args(args)},
                                  background=not args.checkpoint_sync)
    except (ValueError, CheckpointError) as err:
        raise UsageError(str(err)) from err
