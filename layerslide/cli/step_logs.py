"""Where `layerslide train` reports each optimizer step: a line on stdout, a JSON line in
--log-jsonl and scalars in --tensorboard's event files, all numbered alike (1 for the first
step, as the progress bar counts)."""

from __future__ import annotations

import json
import sys
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


def tensorboard_writer(folder: str | None):
    """A SummaryWriter into folder (None: no TensorBoard log)."""
    if folder is None:
        return None
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(log_dir=folder)


class StepReporter:
    """Reports each StepLog as its segment drains; close() flushes the files."""

    def __init__(self, total_steps: int, bar, *, jsonl_path: str | None = None,
                 tensorboard_dir: str | None = None, predicted_step_s: float | None = None):
        self.total, self.bar = total_steps, bar
        self.predicted_step_s = predicted_step_s  # the simulator's, shown beside each step
        self.jsonl = open(jsonl_path, "a") if jsonl_path else None  # noqa: SIM115
        self.tensorboard = tensorboard_writer(tensorboard_dir)

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
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({**asdict(log), "step": number,
                                         "predicted_step_s": self.predicted_step_s}) + "\n")
            self.jsonl.flush()
        if self.tensorboard is not None:
            for tag, field in TENSORBOARD_SCALARS.items():
                value = getattr(log, field)
                if value is None:
                    continue
                if field.endswith("_bytes"):
                    value = gib(value)
                self.tensorboard.add_scalar(tag, value, global_step=number)
            if self.predicted_step_s is not None:
                self.tensorboard.add_scalar("speed/predicted_step_s", self.predicted_step_s,
                                            global_step=number)

    def report_eval(self, result) -> None:
        """An EvalResult, numbered by the steps before it (0: before training)."""
        say(self.bar, f"eval after step {result.step} | loss {result.loss:.4f} | accuracy "
                      f"{result.accuracy:.2%} of {result.tokens:,} tokens | {result.seconds:.1f} s")
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"step": result.step, "eval_loss": result.loss,
                                         "eval_accuracy": result.accuracy,
                                         "eval_tokens": result.tokens,
                                         "eval_s": result.seconds}) + "\n")
            self.jsonl.flush()
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("eval/loss", result.loss, global_step=result.step)
            self.tensorboard.add_scalar("eval/accuracy", result.accuracy,
                                        global_step=result.step)

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
