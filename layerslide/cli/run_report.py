"""What `layerslide train` says once a run has trained: the plan's predicted step and peaks
against the measured ones (and, with --out, prediction-check.json and the timelines), and
where a GPU run's CPU AdamW rate is worth a refined profile."""

from __future__ import annotations

import sys
from pathlib import Path

from layerslide.training.prepare import Run

# the AdamW rate a run kept, off the profile's by more than this, is worth a refined profile
REFINE_HINT_ERROR = 0.05


def report_prediction(run: Run, trainer, logs, first_step: int) -> None:
    """The plan's predicted step and peaks against the run's, as a line and (with --out) as
    prediction-check.json and prediction-timeline.png in the model's folder."""
    from layerslide.reports.run_check import adamw_alone_rates, check_run, write_run_check

    c, prediction = run.config, run.prediction
    if not logs or prediction.step_s is None:
        return
    measured = trainer.trace(f"{trainer.spec.name} measured")
    adamw = (adamw_alone_rates(prediction.trace, measured, layer_params=trainer.spec.layer_params,
                               num_layers=trainer.spec.num_layers)
             if prediction.trace is not None else None)
    check = check_run(profile=_where_found(c.profile), predicted_step_s=prediction.step_s,
                      predicted_gpu_allocated_bytes=prediction.gpu_allocated_peak_bytes,
                      predicted_host_bytes=prediction.peak_bytes.get("host", 0),
                      step_s=[log.step_s for log in logs],
                      gpu_peak_bytes=[log.gpu_peak_bytes for log in logs],
                      host_peak_bytes=[log.host_rss_bytes for log in logs], first_step=first_step,
                      host_copies_bytes=trainer.checkpointing.checkpoint_copy_bytes,
                      adamw_alone_params_per_s=adamw,
                      profile_adamw_params_per_s=run.profile.host.adamw_params_per_s)
    where = "" if trainer.device.is_cuda else " (this run is on the CPU, the profile's is a GPU)"
    print(check.line() + where)
    segment = min(every for every in (c.segment_steps, c.checkpoint_every, c.eval_every,
                                      c.save_every) if every)
    if segment <= 2:  # the simulator predicts a step in a pipeline that runs on
        print(f"note: the run drained its pipeline every {segment} step(s) (--segment-steps, "
              "--checkpoint-every, --eval-every, --save-every): each measured step holds a "
              "fill and drain that the predicted steady step leaves out")
    if c.out:
        try:
            written = write_run_check(check, c.out, predicted=prediction.trace,
                                      measured=measured)
        except OSError as err:
            print(f"warning: the prediction's check was not written into {c.out} "
                  f"({err.strerror or err}); the model there is whole", file=sys.stderr)
            return
        print(f"the prediction's check: {', '.join(str(p) for p in written)}")
        hint = refine_hint(check, c.out, on_gpu=trainer.device.is_cuda)
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
