"""`layerslide train`: fine-tune a Hugging Face model with the executor.

Everything that can be wrong with the input (folder, architecture, plan for another model, data,
a GPU cap or host RAM too small for the plan) is refused before any weight is allocated.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from layerslide.cli.options import (
    UsageError,
    add_policy,
    add_train,
    byte_size,
    byte_size_or_zero,
    positive_seconds,
)
from layerslide.cli.rank_output import errors
from layerslide.cli.run_config import RESOLVED_NAME, with_run_config, write_resolved
from layerslide.cli.run_report import report_prediction
from layerslide.cli.step_logs import StepReporter, say, warn
from layerslide.cli.stopping import GracefulStop, stopped_status
from layerslide.training.distributed import DEFAULT_TIMEOUT_S
from layerslide.training.prepare import Run
from layerslide.training.run import RunConfig

SEVERAL_RANKS = (
    "one rank per GPU, on one host or several: `torchrun --nproc-per-node N -m layerslide train "
    "...` (add --nnodes M --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST:PORT on each "
    "of M hosts), or --gpus N without torchrun, which launches N ranks on this host through "
    "torch.distributed.run. --micro-batch and --grad-accum are per rank: a step learns from "
    "micro-batch x grad-accum x ranks sequences. Rank 0 writes the logs, saves and --out")


def add_train_command(sub, units: str) -> None:
    help = "fine-tune a Hugging Face model (or a preset with random weights) on this machine"
    p = sub.add_parser("train", help=help, description=help, epilog=units)
    p.add_argument("--config", metavar="FILE",
                   help="a TOML file of train options (named as the flags, without dashes: "
                        "micro-batch = 8); flags given here override it; the options a run "
                        f"used are written to --out as {RESOLVED_NAME}")
    p.add_argument("--model",
                   help="a Hugging Face model folder (config.json + safetensors), a Hub model "
                        "id (owner/name, through huggingface_hub's cache), or a preset name for "
                        "random weights (benchmarks); required unless --resume")
    p.add_argument("--plan", help="a plan file from `layerslide tune -o`: its training settings "
                                   "and policy replace the flags below")
    p.add_argument("--data",
                   help="a .jsonl/.json/.parquet/.arrow/.txt file, a folder of them or a saved "
                        "dataset, a Hub dataset name (owner/name or owner/name:split), or "
                        "'synthetic' (random tokens; the default for a preset or --random-init, "
                        "never for a folder's weights)")
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
                        "fractions), --plan, --gpu-memory and --steps (more steps: the cosine "
                        "decay is stretched over them; a finished run trains on) may give it a "
                        "new schedule, --out (and --overwrite) a new model folder, and "
                        "--device, --serial, --trace-out, --log-jsonl, --tensorboard, "
                        "--collective-timeout and --resume-fallback apply; other flags are "
                        "ignored")
    g.add_argument("--resume-fallback", action="store_true",
                   help="if the newest checkpoint fails its checksums, resume from the one "
                        "before it instead of stopping")
    _add_ranks_flags(p)
    add_train(p)
    add_policy(p, plan_steps=False)
    p.set_defaults(run=cmd_train, train_parser=p)


def _add_ranks_flags(p) -> None:
    g = p.add_argument_group("several GPUs or hosts (--gpus, --hosts below)", SEVERAL_RANKS)
    g.add_argument("--collective-timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                   metavar="SECONDS",
                   help="how long a rank waits at a collective for the others before the run "
                        "stops, naming the ranks that did not answer (died, killed or stuck; "
                        "default %(default)s)")


def config_of(args) -> RunConfig:
    """The run's config from the parsed command line (and its --config file): built once,
    here; from then on the run reads only this."""
    if args.config:
        if args.resume:
            raise UsageError("--config starts a run; --resume continues one with the settings "
                             "its checkpoint keeps: give one of them")
        args = with_run_config(args, args.train_parser, args.argv[1:])
    options = vars(args)
    given = frozenset(getattr(args, "given", ())) & set(RunConfig.option_names())
    return RunConfig.from_options(options, config=args.config, given=given,
                                  from_config=frozenset(getattr(args, "from_config", ())))

def cmd_train(args) -> int:
    from layerslide.cli.launch import joined, relaunched, say_stopped
    from layerslide.cli.rank_output import speak_only_on_first
    from layerslide.training.distributed import is_collective_failure, leave, under_torchrun

    if under_torchrun():  # one of several ranks: rank 0 speaks for the run from the start
        speak_only_on_first(int(os.environ["RANK"]))
    config = config_of(args)
    status = relaunched(config, args.argv)  # --gpus N outside torchrun: N ranks of this command
    if status is not None:
        return status
    say_error = _error_sayer(args)
    ranks = joined(config, say_error)
    try:
        status = _run(config, ranks, say_error)
    except Exception as err:  # a run of several ranks that a collective stopped says who left
        if ranks.world == 1 or not is_collective_failure(err):
            raise
        say_stopped(ranks, err)
        return 1
    if status == 0:  # (after a failure the groups go with the process: NCCL's may not part)
        leave(ranks)
    return status


def _error_sayer(args):
    """How a refusal is said (as main says one): for rank 0 to say the ranks'."""
    from layerslide.cli.options import in_flag_words

    def say_error(message: str) -> None:
        print(f"layerslide train: error: {in_flag_words(message, args.parser, args.given)}",
              file=errors(), flush=True)
    return say_error


def _run(config: RunConfig, ranks, say_error) -> int:
    """Check, allocate and train: each of the first three on every rank before any goes on."""
    from layerslide.cli.launch import on_every_rank
    from layerslide.training.distributed import cores_per_rank
    from layerslide.training.prepare import prepare

    cores = cores_per_rank(ranks) if ranks.world > 1 else None
    run = on_every_rank(ranks, lambda: prepare(config, ranks=ranks, rank_cores=cores), say_error)
    trainer = on_every_rank(ranks, _trainer_of(run), say_error,
                            undo=lambda trainer: trainer.close())
    with trainer:
        on_every_rank(ranks, lambda: _start(run, trainer), say_error)
        return _train(run, trainer)


def _trainer_of(run: Run):
    def make():
        try:
            return run.trainer()
        except ValueError as err:
            raise UsageError(str(err)) from err
    return make


def _start(run: Run, trainer) -> None:
    """Say what runs, and give the trainer its starting weights: the checkpoint a resume
    continues from, the model folder's, or random ones."""
    from layerslide.training.checkpoint_store import CheckpointError

    c, train, policy = run.config, run.plan.train, run.plan.policy
    ranks = f" x {train.ranks} ranks" if train.ranks > 1 else ""
    print(f"{run.spec.name}: {run.spec.total_params / 1e9:.2f} B params on {run.device}; "
          f"micro-batch {train.micro_batch} x {train.seq_len} tokens x {train.grad_accum}"
          f"{ranks}; "
          f"window {policy.residency.window}, activations on "
          f"{policy.residency.activations}, cast {policy.schedule.cast}", flush=True)
    try:
        if c.resume:
            info = trainer.checkpointing.restore_state(run.checkpoints.store, run.data,
                                                       fallback=c.resume_fallback)
            print(f"resuming from {info.path} after step {trainer.step}", flush=True)
        elif run.weights is not None:
            print(f"loading weights from {run.weights}", flush=True)
            trainer.load_checkpoint(run.weights)
        else:
            trainer.init_random(c.seed)
    except (ValueError, OSError, CheckpointError) as err:  # OSError: weights kept on NVMe
        raise UsageError(str(err)) from err
    if run.checkpoints is not None and run.checkpoints.background:  # RAM faulted in now
        kept_gb = trainer.checkpointing.keep_checkpoint_copies() / 1e9
        state_gb = trainer.checkpointing.host_updated_state_bytes / 1e9
        print(f"checkpoints beside training: {kept_gb:.1f} GB of RAM kept for copies of "
              f"the {state_gb:.1f} GB state the host updates (updates of blocks beyond it "
              "wait for their write)" if kept_gb < state_gb else
              f"checkpoints beside training: {kept_gb:.1f} GB of RAM kept for copies of "
              "the state", flush=True)


def _train(run: Run, trainer) -> int:
    """Train to the config's step count, reporting each step; save the model. The exit status:
    0, 1 where training failed, 128 + a signal's number where one stopped it. Of several
    ranks, rank 0 alone writes the logs, the trace and the output folder; every rank takes
    part in a save (each holds a slice of the state)."""
    from tqdm import tqdm

    from layerslide.training.hf_io import ModelSaveError, tokenizer_files

    c, schedule, first = run.config, run.checkpoints, run.ranks.is_first
    # the bar moves as steps' tasks have run; each step's line comes once its GPU work has
    bar = tqdm(total=c.steps, initial=trainer.step, unit="step", file=sys.stderr,
               dynamic_ncols=True, disable=None if first else True)
    reporter = StepReporter(c.steps, bar, jsonl_path=c.log_jsonl if first else None,
                            tensorboard_dir=c.tensorboard if first else None,
                            predicted_step_s=run.prediction.step_s)
    first_step = trainer.step + 1
    if not c.trace_out:  # the steps the prediction's timeline shows
        from layerslide.reports.run_check import WARMUP_STEPS
        trainer.trace_steps = trainer.step + WARMUP_STEPS + 1
    if run.evals is not None and trainer.step == 0:  # the score training starts from
        reporter.report_eval(trainer.evaluate(run.evals.batches))
    stop = GracefulStop(bar)
    extra = tokenizer_files(run.tokenizer)  # the tokenizer the data was read with goes along
    try:  # the handlers stay through the final save: a first Ctrl-C lets it finish
        try:
            logs = trainer.fit(
                run.data, c.steps - trainer.step, on_step=reporter,
                on_step_done=lambda _step: bar.update(1), checkpoints=schedule,
                on_checkpoint=lambda info, seconds: say(
                    bar, f"checkpoint of step {info.step} in {info.path}: "
                    f"{info.total_bytes / 1e9:.2f} GB; training paused {seconds:.1f} s for it"),
                stop=stop.event, evals=run.evals,
                on_eval=reporter.report_eval,
                save_every=None if run.saves is None else run.saves.every_steps,
                on_save=_model_saver(run, trainer, bar, extra))
        except Exception as err:
            bar.close()
            if not _said_stopped(err, run):
                raise
            return 1
        finally:
            bar.close()
            reporter.close()
        if trainer.stopped:
            return stopped_status(trainer, schedule, stop.signum)
        if c.out:
            stop.doing = f"the model's save to {c.out}"
            try:
                saved = trainer.save(c.out, overwrite=c.overwrite, extra_files=extra)
            except ModelSaveError as err:
                return _save_failed(err, run)
            if first:
                _write_options(saved, run, bar)
                print(f"saved the fine-tuned model to {saved}", flush=True)
    finally:
        stop.restore()
        if c.trace_out and first:  # after the model: a disk the trace fills costs the trace
            _write_trace(trainer, run, bar)
    if stop.signum is not None:
        return 128 + stop.signum
    if first:
        report_prediction(run, trainer, logs, first_step)
    return 0


def _model_saver(run: Run, trainer, bar, extra):
    """fit's on_save: the model every --save-every steps. Rank 0 writes the folder and keeps
    the newest --keep-saves; every other rank hands its slice to that save."""
    from layerslide.training.hf_io import ModelSaveError

    def save_model(step: int) -> None:
        if not run.ranks.is_first:
            trainer.save(run.saves.folder_of(step), overwrite=True, extra_files=extra)
            return
        try:
            path = run.saves.save(trainer, step, extra,
                                  after_write=lambda saved: _write_options(saved, run, bar))
        except ModelSaveError as err:  # a save along the way: the run goes on
            warn(bar, f"--save-every: {err}; training goes on{_way_back(run.checkpoints)}")
            return
        say(bar, f"saved the model after step {step} to {path}")
    return save_model


def _said_stopped(err: Exception, run: Run) -> bool:
    """Say why training stopped, where it is a failed task, checkpoint or (of several ranks)
    collective, and the way back from the last checkpoint; False for any other error."""
    from layerslide.cli.launch import say_stopped
    from layerslide.executor.engine import TaskFailedError
    from layerslide.training.checkpoint_store import CheckpointError
    from layerslide.training.distributed import is_collective_failure
    from layerslide.training.rank_checkpoints import newest_checkpoint

    schedule = run.checkpoints
    if run.ranks.world > 1 and is_collective_failure(err):
        say_stopped(run.ranks, err)
    elif isinstance(err, (TaskFailedError, CheckpointError)):
        print(f"layerslide train: training stopped: {err}", file=errors())
    else:
        return False
    latest = None if schedule is None else newest_checkpoint(schedule.store)
    if latest is not None:
        print(f"the last complete checkpoint, {latest.path}, is intact: "
              f"continue with `layerslide train --resume {schedule.store.root}`", file=errors())
    return True


def _write_options(folder: Path, run: Run, bar) -> None:
    """The run's options beside a saved model (its layerslide-train.toml); a failed write
    costs the file alone."""
    try:
        write_resolved(folder, run.config)
    except OSError as err:
        warn(bar, f"{folder / RESOLVED_NAME} was not written ({err.strerror or err}); the "
                  "model beside it is whole")


def _write_trace(trainer, run: Run, bar) -> None:
    """--trace-out, once the model is saved; a failed write is said and leaves no partial
    file."""
    path = Path(run.config.trace_out)
    try:
        trainer.trace(f"{run.spec.name} measured").save(path)
    except OSError as err:
        path.unlink(missing_ok=True)
        warn(bar, f"--trace-out {path}: writing the trace failed ({err.strerror or err}); "
                  "nothing else is affected")


def _way_back(schedule) -> str:
    """Where the trained state is kept when a model folder could not be written."""
    from layerslide.training.rank_checkpoints import newest_checkpoint
    latest = None if schedule is None else newest_checkpoint(schedule.store)
    if latest is None:
        return ""
    return (f"; checkpoint {latest.path} holds the state of step {latest.step}: "
            f"`layerslide export {schedule.store.root} --out FOLDER` writes its model")


def _save_failed(err: ValueError, run: Run) -> int:
    """The final model could not be written: what it needs, and the way back to it."""
    from layerslide.training.output_space import model_bytes, size
    from layerslide.training.rank_checkpoints import newest_checkpoint

    c, schedule = run.config, run.checkpoints
    print(f"layerslide train: error: {err}", file=errors())
    latest = None if schedule is None else newest_checkpoint(schedule.store)
    need = size(model_bytes(run.spec.total_params, run.tokenizer))
    if latest is not None:
        print(f"nothing trained is lost: checkpoint {latest.path} holds the state of step "
              f"{latest.step}; free {need} for the model there (or choose another folder) and "
              f"write it with `layerslide export {schedule.store.root} --out {c.out}`",
              file=errors())
    else:
        print("no checkpoint keeps the trained state (the run had no --checkpoint-dir), so "
              f"these steps are lost; the model needs {need}: give the next run room there, "
              "and --checkpoint-dir to keep a way back", file=errors())
    return 1


