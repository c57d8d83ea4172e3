"""How far a run's prediction held: the simulator's step time and peaks for the plan next to
what `layerslide train` measured, as one line, a JSON record and a timeline of one step each."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from layerslide.trace import Trace

WARMUP_STEPS = 2  # the first steps carry compilation and first touches of memory
QUANTITIES = {"step_s": "step", "gpu_allocated_bytes": "GPU allocated peak",
              "host_bytes": "host peak"}
CHECK_FILE, TIMELINE_FILE = "prediction-check.json", "prediction-timeline.png"


@dataclass(frozen=True, kw_only=True)
class RunCheck:
    """One run's predicted and measured figures; measured step: the median of steps
    `first_step`..`last_step` (1-based, as train's lines count)."""

    profile: str
    first_step: int
    last_step: int
    predicted_step_s: float
    measured_step_s: float
    predicted_gpu_allocated_bytes: int
    measured_gpu_allocated_bytes: int
    predicted_host_bytes: int
    measured_host_bytes: int
    host_copies_bytes: int = 0  # RAM kept for checkpoint copies, outside the plan (predicted)
    # whether the measured steps are past this process's warm-up (a resumed run's first steps
    # compile and touch memory as a fresh run's do, whatever their numbers)
    past_warmup: bool | None = None
    # the decoder layers' CPU AdamW with no copy beside it (reports.validation's "alone"),
    # params/s, where both traces had such tasks: the profile's figure a CPU-bound step rests on
    predicted_adamw_alone_params_per_s: float | None = None
    measured_adamw_alone_params_per_s: float | None = None
    # the profile's own AdamW figure (host.adamw_throughput) the prediction was made with
    profile_adamw_params_per_s: float | None = None

    def error(self, quantity: str) -> float | None:
        """(predicted - measured) / measured; None where either is missing (a CPU run has no
        GPU peak)."""
        measured, predicted = (getattr(self, f"{side}_{quantity}")
                               for side in ("measured", "predicted"))
        if not measured or predicted is None:
            return None
        return predicted / measured - 1

    def to_dict(self) -> dict:
        return {**asdict(self), "errors": {q: self.error(q) for q in
                                           (*QUANTITIES, "adamw_alone_params_per_s")}}

    def line(self) -> str:
        """The summary a user reads at the end of a run."""
        steps = (f"step {self.first_step}" if self.first_step == self.last_step
                 else f"steps {self.first_step}-{self.last_step}")
        parts = [(f"prediction on {self.profile}: {self.predicted_step_s:.3f} s/step against "
                  f"{self.measured_step_s:.3f} s measured (median of {steps}), "
                  f"{_signed(self.error('step_s'))}")]
        for quantity, unit in (("gpu_allocated_bytes", "GPU allocated peak"),
                               ("host_bytes", "host peak")):
            error = self.error(quantity)
            if error is not None:
                kept = (f" (with {self.host_copies_bytes / 2**30:.2f} GiB kept for checkpoint "
                        "copies)" if quantity == "host_bytes" and self.host_copies_bytes else "")
                parts.append(f"{unit} {getattr(self, f'predicted_{quantity}') / 2**30:.2f}{kept} "
                             f"against {getattr(self, f'measured_{quantity}') / 2**30:.2f} GiB, "
                             f"{_signed(error)}")
        adamw = self.error("adamw_alone_params_per_s")
        if adamw is not None:
            parts.append(f"CPU AdamW alone {self.predicted_adamw_alone_params_per_s / 1e9:.2f} "
                         f"against {self.measured_adamw_alone_params_per_s / 1e9:.2f} Gparam/s, "
                         f"{_signed(adamw)}")
        return "; ".join(parts)


def _signed(error: float) -> str:
    return f"{error:+.1%}"


def check_run(*, profile: str, predicted_step_s: float, predicted_gpu_allocated_bytes: int,
              predicted_host_bytes: int, step_s: Sequence[float], gpu_peak_bytes: Sequence[int],
              host_peak_bytes: Sequence[int], first_step: int = 1,
              host_copies_bytes: int = 0,
              adamw_alone_params_per_s: tuple[float, float] | None = None,
              profile_adamw_params_per_s: float | None = None) -> RunCheck:
    """The check of a run whose steps (numbered from `first_step`) took `step_s` with those
    peaks: the steps after the warm-up ones, or the last where the run had no more. The plan's
    host peak leaves out the RAM kept for checkpoint copies (`host_copies_bytes`): added here.
    adamw_alone_params_per_s: predicted and measured (adamw_alone_rates), if known."""
    if not step_s:
        raise ValueError("a run check needs at least one measured step")
    skip = WARMUP_STEPS if len(step_s) > WARMUP_STEPS else len(step_s) - 1
    steady = step_s[skip:]
    return RunCheck(profile=profile, first_step=first_step + skip,
                    past_warmup=len(step_s) > WARMUP_STEPS,
                    last_step=first_step + len(step_s) - 1, predicted_step_s=predicted_step_s,
                    measured_step_s=statistics.median(steady),
                    predicted_gpu_allocated_bytes=predicted_gpu_allocated_bytes,
                    measured_gpu_allocated_bytes=max(gpu_peak_bytes, default=0),
                    predicted_host_bytes=predicted_host_bytes + host_copies_bytes,
                    measured_host_bytes=max(host_peak_bytes, default=0),
                    host_copies_bytes=host_copies_bytes,
                    profile_adamw_params_per_s=profile_adamw_params_per_s,
                    **(dict(zip(("predicted_adamw_alone_params_per_s",
                                 "measured_adamw_alone_params_per_s"),
                                adamw_alone_params_per_s, strict=True))
                       if adamw_alone_params_per_s else {}))


def adamw_alone_rates(predicted: Trace, measured: Trace, *, layer_params: int,
                      num_layers: int) -> tuple[float, float] | None:
    """The decoder layers' CPU AdamW rate with no copy beside it in the predicted trace (from its
    second step) and in the measured one (after WARMUP_STEPS), or None where either has no such
    task (the layers updated on the GPU, or never alone)."""
    from layerslide.reports.validation import adamw_rates_by_company

    found = []
    for trace, first_step in ((predicted, 1), (measured, WARMUP_STEPS)):
        steps = max((e.step for e in trace.events), default=0)
        alone = adamw_rates_by_company(trace, layer_params=layer_params, num_layers=num_layers,
                                       first_step=min(first_step, steps)).get("alone")
        if alone is None:
            return None
        found.append(alone["params_per_s"])
    return found[0], found[1]


def one_step(trace: Trace, step: int, label: str) -> Trace:
    """The events of one step (0-based, as traces number them), moved to start at 0."""
    events = [e for e in trace.events if e.step == step]
    start_s = min((e.start_s for e in events), default=0.0)
    moved = tuple(e.shifted(-start_s) for e in events)
    return Trace(source=trace.source, label=label, events=moved)


def write_run_check(check: RunCheck, folder: str | Path, *, predicted: Trace | None = None,
                    measured: Trace | None = None) -> list[Path]:
    """prediction-check.json in folder and, given both traces, prediction-timeline.png: the
    plan's last predicted step above the last measured step whose events were kept."""
    folder = Path(folder)
    written = [folder / CHECK_FILE]
    written[0].write_text(json.dumps(check.to_dict(), indent=1) + "\n")
    if predicted is not None and measured is not None and measured.events:
        from layerslide.reports.figures import plot_timeline

        predicted_step = max(e.step for e in predicted.events)
        measured_step = max(e.step for e in measured.events)
        traces = [one_step(predicted, predicted_step, f"{check.profile}, a steady step"),
                  one_step(measured, measured_step, f"step {measured_step + 1}")]
        written.append(plot_timeline(traces, folder / TIMELINE_FILE,
                                     title=check.line().split("; ")[0]))
    return written
