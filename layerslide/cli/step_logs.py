"""Where `layerslide train` reports each optimizer step: a line on stdout, a JSON line in
--log-jsonl and scalars in --tensorboard's event files, all numbered alike (1 for the first
step, as the progress bar counts). A log file that cannot be written (a full disk) is said once
and dropped: the run goes on without it."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict

from layerslide.cli.options import gib
from layerslide.training.inputs import require_tensorboard

# TensorBoard scalar tag -> the StepLog field it shows (memory in GiB)
TENSORBOARD_SCALARS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
                       "speed/step_s": "step_s", "speed/tokens_per_s": "tokens_per_s",
                       "speed/model_tflops": "model_tflops",
                       "memory/gpu_peak_gib": "gpu_peak_bytes",
                       "memory/host_rss_gib": "host_rss_bytes"}


def say(bar, line: str) -> None:
    """A line on stdout above the progress bar, flushed: outside a terminal (a log file, a
    pipe, a batch scheduler) stdout is block-buffered and lines would come in bursts."""
    bar.write(line, file=sys.stdout)
    sys.stdout.flush()


def warn(bar, line: str) -> None:
    """A warning on stderr above the progress bar."""
    bar.write(f"warning: {line}", file=sys.stderr)


def tensorboard_writer(folder: str | None):
    """A SummaryWriter into folder (None: no TensorBoard log)."""
    if folder is None:
        return None
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(log_dir=folder)


class _QuietTensorBoardThread:
    """While installed, a TensorBoard writer thread's failure is not printed as a traceback:
    the writer raises it again at its next call, where the reporter says it once."""

    def __init__(self):
        self._previous = threading.excepthook
        threading.excepthook = self._hook

    def _hook(self, args) -> None:
        if type(args.thread).__name__ != "_AsyncWriterThread":
            self._previous(args)

    def restore(self) -> None:
        threading.excepthook = self._previous


class StepReporter:
    """Reports each StepLog as the step lands (from the Trainer's step-log thread); close()
    flushes the files."""

    def __init__(self, total_steps: int, bar, *, jsonl_path: str | None = None,
                 tensorboard_dir: str | None = None, predicted_step_s: float | None = None):
        self.total, self.bar = total_steps, bar
        self.predicted_step_s = predicted_step_s  # the simulator's, shown beside each step
        self.jsonl_path = jsonl_path
        # a raw descriptor: each record goes to the OS in its own writes, and no buffer is
        # left over to be written again (past a cut-back end) once a write has failed
        self.jsonl = (os.open(jsonl_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                      if jsonl_path else None)
        self.tensorboard_dir = tensorboard_dir
        # before the writer: its thread's first write may fail at once
        self._quiet = _QuietTensorBoardThread() if tensorboard_dir is not None else None
        self.tensorboard = None
        try:
            self.tensorboard = tensorboard_writer(tensorboard_dir)
        except OSError as err:  # its first event is written at once
            self._drop_tensorboard(err)
        self.last_logged = 0  # the last step whose JSON line is whole in --log-jsonl

    def __call__(self, log) -> None:
        number = log.step + 1
        status = " SKIPPED (non-finite grads)" if log.skipped else (
            f" (skipped blocks {list(log.skipped_blocks)})" if log.skipped_blocks else "")
        norm = "" if log.grad_norm is None else f" | grad norm {log.grad_norm:.3f}"
        predicted = ("" if self.predicted_step_s is None
                     else f" (predicted {self.predicted_step_s:.3f})")
        say(self.bar, f"step {number}/{self.total} | loss {log.loss:.4f} | lr {log.lr:.2e}"
                      f"{norm} | {log.step_s:.3f} s{predicted} | {log.tokens_per_s:,.0f} tok/s | "
                      f"{log.model_tflops:.1f} TFLOP/s | GPU {gib(log.gpu_peak_bytes):.2f} GiB"
                      f" | host {gib(log.host_rss_bytes):.1f} GiB{status}")
        self._append({**asdict(log), "step": number, "predicted_step_s": self.predicted_step_s},
                     number)
        self._scalars(number, {tag: getattr(log, field)
                               for tag, field in TENSORBOARD_SCALARS.items()})

    def _scalars(self, step: int, values: dict[str, float | None]) -> None:
        def write(writer) -> None:
            for tag, value in values.items():
                if value is not None:
                    writer.add_scalar(tag, gib(value) if tag.startswith("memory/") else value,
                                      global_step=step)
            if self.predicted_step_s is not None and "train/loss" in values:
                writer.add_scalar("speed/predicted_step_s", self.predicted_step_s,
                                  global_step=step)
        self._to_tensorboard(write)

    def report_eval(self, result) -> None:
        """An EvalResult, numbered by the steps before it (0: before training)."""
        say(self.bar, f"eval after step {result.step} | loss {result.loss:.4f} | accuracy "
                      f"{result.accuracy:.2%} of {result.tokens:,} tokens | {result.seconds:.1f} s")
        self._append({"step": result.step, "eval_loss": result.loss,
                      "eval_accuracy": result.accuracy, "eval_tokens": result.tokens,
                      "eval_s": result.seconds}, None)
        self._scalars(result.step, {"eval/loss": result.loss, "eval/accuracy": result.accuracy})

    def _append(self, record: dict, step: int | None) -> None:
        """One JSON line, written through to the OS; a failed write is cut back off the file
        (no half record for a reader to choke on), said once, and the log dropped."""
        if self.jsonl is None:
            return
        line = (json.dumps(record) + "\n").encode()
        try:
            whole = os.lseek(self.jsonl, 0, os.SEEK_END)
            while line:  # a write may take part of it (a disk filling up)
                line = line[os.write(self.jsonl, line):]
        except OSError as err:
            self._drop_jsonl(err, whole)
            return
        self.last_logged = step or self.last_logged

    def _drop_jsonl(self, err: OSError, whole: int) -> None:
        jsonl, self.jsonl = self.jsonl, None
        for undo in (lambda: os.ftruncate(jsonl, whole), lambda: os.close(jsonl)):
            try:
                undo()
            except OSError:
                pass  # a disk that refuses even that: nothing more to keep
        kept = f"step {self.last_logged}" if self.last_logged else "no step"
        warn(self.bar, f"--log-jsonl {self.jsonl_path}: writing failed ({err.strerror or err}); "
                       f"the run goes on without it (its last whole record is of {kept})")

    def _to_tensorboard(self, write: Callable) -> None:
        """Write through the TensorBoard writer; a failure (its thread's, raised here) is said
        once and the event files dropped."""
        if self.tensorboard is None:
            return
        try:
            write(self.tensorboard)
        except OSError as err:
            self._drop_tensorboard(err)

    def _drop_tensorboard(self, err: OSError) -> None:
        self.tensorboard = None
        warn(self.bar, f"--tensorboard {self.tensorboard_dir}: writing failed "
                       f"({err.strerror or err}); the run goes on without it")

    def close(self) -> None:
        if self.jsonl is not None:
            os.close(self.jsonl)  # every record went to the OS as it was written
            self.jsonl = None
        self._to_tensorboard(lambda writer: writer.close())
        if self._quiet is not None:
            self._quiet.restore()
