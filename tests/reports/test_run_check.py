"""reports.run_check: a run's measured steps and peaks against its prediction."""

import json

import pytest

from layerslide.reports.run_check import WARMUP_STEPS, check_run, one_step, write_run_check
from layerslide.trace import Trace, TraceEvent


def check(step_s, gpu=(0,), host=(2 << 30,), first_step=1):
    return check_run(profile="box", predicted_step_s=1.1, predicted_gpu_allocated_bytes=3 << 30,
                     predicted_host_bytes=3 << 30, step_s=step_s, gpu_peak_bytes=gpu,
                     host_peak_bytes=host, first_step=first_step)


def test_the_measured_step_is_the_median_after_the_warm_up_steps():
    found = check([9.0, 5.0, 1.2, 0.8, 1.0], gpu=[2 << 30, 4 << 30], first_step=11)
    assert (found.first_step, found.last_step) == (13, 15)
    assert found.measured_step_s == 1.0
    assert found.error("step_s") == pytest.approx(0.1)
    assert found.measured_gpu_allocated_bytes == 4 << 30  # the highest of the run
    assert found.error("gpu_allocated_bytes") == pytest.approx(-0.25)
    assert found.error("host_bytes") == pytest.approx(0.5)
    assert found.line() == ("prediction on box: 1.100 s/step against 1.000 s measured (median "
                            "of steps 13-15), +10.0%; GPU allocated peak 3.00 against 4.00 GiB, "
                            "-25.0%; host peak 3.00 against 2.00 GiB, +50.0%")


def test_a_short_run_is_checked_on_its_last_step_and_an_empty_one_refused():
    found = check([3.0, 2.0])
    assert (found.first_step, found.last_step, found.measured_step_s) == (2, 2, 2.0)
    assert "median of step 2)" in found.line()
    assert found.error("gpu_allocated_bytes") is None and "GPU" not in found.line()
    with pytest.raises(ValueError, match="at least one measured step"):
        check([])


def test_ram_kept_for_checkpoint_copies_joins_the_predicted_host_peak_and_is_named():
    found = check_run(profile="box", predicted_step_s=1.0, predicted_gpu_allocated_bytes=0,
                      predicted_host_bytes=3 << 30, step_s=[1.0], gpu_peak_bytes=[0],
                      host_peak_bytes=[4 << 30], host_copies_bytes=1 << 30)
    assert found.predicted_host_bytes == 4 << 30 and found.error("host_bytes") == 0
    assert "host peak 4.00 (with 1.00 GiB kept for checkpoint copies) against 4.00 GiB" in (
        found.line())


def test_a_resumed_runs_steps_are_past_the_warm_up_by_their_count_not_their_numbers():
    def resumed(steps):
        return check_run(profile="box", predicted_step_s=1.0, predicted_gpu_allocated_bytes=0,
                         predicted_host_bytes=0, step_s=[1.0] * steps, gpu_peak_bytes=[0],
                         host_peak_bytes=[0], first_step=8)

    assert resumed(1).first_step == 8 and resumed(1).past_warmup is False
    assert resumed(WARMUP_STEPS + 1).past_warmup is True


def events(step, start_s, lanes=("gpu", "cpu")):
    return [TraceEvent(task_id=f"{lane}{step}", lane=lane, kind="forward", block=0, step=step,
                       start_s=start_s + i, end_s=start_s + i + 0.5)
            for i, lane in enumerate(lanes)]


def test_one_step_keeps_that_step_from_zero():
    trace = Trace(source="measured", label="run", events=(*events(0, 0.0), *events(1, 7.0)))
    step = one_step(trace, 1, "step 2")
    assert [(e.step, e.start_s, e.end_s) for e in step.events] == [(1, 0.0, 0.5), (1, 1.0, 1.5)]
    assert (step.source, step.label) == ("measured", "step 2")
    # an event's enqueue moves with it; a host lane's absent one stays absent
    enqueued = TraceEvent(task_id="g", lane="gpu", kind="forward", block=0, step=0,
                          start_s=7.5, end_s=8.0, dispatch_start_s=7.2, dispatch_end_s=7.9)
    moved = one_step(Trace(source="measured", label="r", events=(*events(0, 7.0), enqueued)),
                     0, "s").events
    assert [(e.dispatch_start_s, e.dispatch_end_s) for e in moved] == [
        (None, None), (None, None), (pytest.approx(0.2), pytest.approx(0.9))]


def test_the_check_is_written_with_a_timeline_of_both_traces(tmp_path):
    found = check([1.0, 1.0, 1.0])
    predicted = Trace(source="simulated", label="p", events=(*events(0, 0), *events(2, 3)))
    measured = Trace(source="measured", label="m", events=tuple(events(1, 4.0)))
    written = write_run_check(found, tmp_path, predicted=predicted, measured=measured)
    assert [p.name for p in written] == ["prediction-check.json", "prediction-timeline.png"]
    record = json.loads(written[0].read_text())
    assert record["errors"]["step_s"] == pytest.approx(0.1)
    assert record["measured_step_s"] == 1.0
    assert written[1].stat().st_size > 10_000
    assert len(write_run_check(found, tmp_path, measured=None)) == 1  # no traces: the JSON alone


def adamw_step(step, start_s, seconds, block=0):
    return TraceEvent(task_id=f"adamw{step}.{block}", lane="cpu", kind="optimizer_step",
                      block=block, step=step, start_s=start_s, end_s=start_s + seconds)


def test_the_cpu_adamw_alone_is_set_against_its_prediction():
    from layerslide.reports.run_check import adamw_alone_rates

    # predicted: a 5 G-param layer in 1 s from step 1 on; measured: 0.8 s after the 2 warm-up steps
    predicted = Trace(source="simulated", label="p", events=(
        adamw_step(0, 0.0, 5.0), adamw_step(1, 5.0, 1.0), adamw_step(2, 6.0, 1.0)))
    measured = Trace(source="measured", label="m", events=(
        adamw_step(0, 0.0, 9.0), adamw_step(1, 9.0, 9.0), adamw_step(2, 18.0, 0.8),
        adamw_step(3, 19.0, 0.8),
        adamw_step(3, 20.0, 0.1, block=5)))  # not a decoder layer of this 2-layer model
    rates = adamw_alone_rates(predicted, measured, layer_params=5 * 10**9, num_layers=2)
    assert rates == pytest.approx((5e9, 6.25e9))
    found = check_run(profile="box", predicted_step_s=1.0, predicted_gpu_allocated_bytes=0,
                      predicted_host_bytes=1 << 30, step_s=[1.0], gpu_peak_bytes=[0],
                      host_peak_bytes=[1 << 30], adamw_alone_params_per_s=rates)
    assert found.error("adamw_alone_params_per_s") == pytest.approx(-0.2)
    assert found.line().endswith("; CPU AdamW alone 5.00 against 6.25 Gparam/s, -20.0%")
    assert found.to_dict()["errors"]["adamw_alone_params_per_s"] == pytest.approx(-0.2)
    assert "AdamW" not in check([1.0]).line()  # not given: not shown
    # no AdamW task without a copy beside it in one of the traces: nothing to compare
    assert adamw_alone_rates(predicted, Trace(source="measured", label="m", events=()),
                             layer_params=100, num_layers=2) is None
