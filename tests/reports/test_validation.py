"""The predicted-vs-measured report: errors, rank correlation, table and figure."""

from __future__ import annotations

import pytest

from layerslide.reports.validation import (
    GIB,
    adamw_rates_by_company,
    allocator_table,
    busy_s,
    company_table,
    dispatch_table,
    figure,
    gpu_dispatch,
    judge,
    markdown,
    ranks,
    regime_lines,
    regime_of,
    relative_error,
    share_beside,
    spearman,
    summarize,
)
from layerslide.trace import Trace, TraceEvent


def row(label, step, predicted_step, gpu=1.0, host=10.0, error=0.0):
    return {"label": label, "measured_step_s": step, "predicted_step_s": predicted_step,
            "measured_gpu_allocated_bytes": gpu * GIB,
            "predicted_gpu_allocated_bytes": gpu * GIB * (1 + error),
            "measured_gpu_reserved_bytes": 1.2 * gpu * GIB,
            "predicted_gpu_reserved_bytes": gpu * GIB,
            "measured_host_bytes": host * GIB, "predicted_host_bytes": host * GIB}


def test_ranks_share_ties_and_spearman_matches_hand_values():
    assert ranks([3.0, 1.0, 2.0, 1.0]) == [4.0, 1.5, 3.0, 1.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swapped pair out of 4: 1 - 6 * (1 + 1) / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="equal length"):
        spearman([1], [1])


def test_summary_reports_mean_and_worst_errors_and_the_rank_agreement():
    rows = [row("a", 1.0, 1.02), row("b", 2.0, 1.90, error=0.03), row("c", 3.0, 3.3)]
    assert relative_error(rows[1], "step_s") == pytest.approx(-0.05)
    s = summarize(rows)
    assert s["configurations"] == 3
    assert s["step_s"]["mean_abs_error"] == pytest.approx((0.02 + 0.05 + 0.10) / 3)
    assert s["step_s"]["worst"] == "c" and s["step_s"]["worst_error"] == pytest.approx(0.10)
    assert s["step_s"]["spearman"] == pytest.approx(1.0)
    assert s["gpu_allocated_bytes"]["worst"] == "b"
    assert s["gpu_reserved_bytes"]["mean_abs_error"] == pytest.approx(1 - 1 / 1.2)


def test_table_and_figure_are_written(tmp_path):
    rows = [row("1B mb1", 0.4, 0.41), row("3B mb64", 3.0, 2.9)]
    table = markdown(rows)
    assert "| 1B mb1 | - | 0.400 | 0.410 | +2.5% |" in table
    assert "Spearman" in table and "mean absolute error" in table
    png = figure(rows, tmp_path / "fig" / "validation.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quantities_not_measured_show_as_dashes(tmp_path):
    rows = [row("cpu run", 0.4, 0.41, gpu=0.0)]
    rows[0]["predicted_gpu_allocated_bytes"] = GIB
    table = markdown(rows)
    assert "| cpu run | - | 0.400 | 0.410 | +2.5% | - | 1.00 | - |" in table
    assert "gpu_allocated_bytes" not in summarize(rows)
    figure(rows, tmp_path / "v.png")


def test_overflowing_plans_and_policy_groups(tmp_path):
    rows = [row("a", 1.0, 1.1), row("b", 2.0, 1.9), row("c", 3.0, 2.5), row("d", 4.0, None)]
    for r in rows[:3]:
        r["group"] = "3B mb8"
    rows[2]["predicted_step_s"], rows[1]["predicted_step_s"] = 1.8, 2.5  # c and b swapped
    s = summarize(rows)
    assert s["step_s"]["spearman_within_groups"] == {"3B mb8": pytest.approx(0.5)}
    table = markdown(rows)
    assert "| d | - | 4.000 | overflow |" in table and "among the policies of 3B mb8" in table
    figure(rows, tmp_path / "v.png")


def test_task_medians_compare_decoder_layer_tasks_kind_by_kind():
    from layerslide.reports.validation import median_task_s
    from layerslide.trace import Trace, TraceEvent

    def event(kind, lane, layer, step, duration_s):
        return TraceEvent(task_id=f"s{step}.{kind}.{layer}", lane=lane, kind=kind, block=layer,
                          step=step, start_s=0.0, end_s=duration_s)

    trace = Trace(source="measured", label="x", events=(
        event("optimizer_step", "cpu", 0, 0, 9.0),  # before first_step: left out
        event("optimizer_step", "cpu", 0, 1, 0.020), event("optimizer_step", "cpu", 1, 1, 0.030),
        event("optimizer_step", "cpu", 2, 1, 0.025),
        event("optimizer_step", "cpu", -1, 1, 5.0),  # the embedding: another size, left out
        event("optimizer_step", "cpu", 4, 1, 7.0),  # the head (4 decoder layers): left out
        event("optimizer_step", "gpu", 3, 1, 0.001),  # updated on the GPU: not the CPU's kind
        event("backward", "gpu", 0, 1, 0.004), event("backward", "gpu", 1, 1, 0.006)))
    got = median_task_s(trace, num_layers=4, first_step=1)
    assert got == {"optimizer_step@cpu": 0.025, "backward@gpu": pytest.approx(0.005)}
    measured = {**row("cfg", 1.0, 1.1), "measured_task_s": got,
                "predicted_task_s": {"optimizer_step@cpu": 0.020}}
    text = markdown([measured])
    assert "| cfg | 25.0 / 20.0 | - | - | - | - |" in text


def test_the_allocator_table_shows_active_and_reserved_bytes_per_lane():
    plain = row("3b-mb8", 1.0, 1.0)
    measured = {**plain, "measured_gpu_allocated_bytes": 3 * GIB,
                "measured_gpu_reserved_bytes": 5 * GIB, "allocator_cap_bytes": 24 * GIB,
                "gpu_memory_detail": {"active_peak_bytes": 4.5 * GIB,
                                      "reserved_by_lane_bytes": {"h2d": GIB / 2,
                                                                 "gpu": 4.5 * GIB}}}
    lines = allocator_table([plain, measured])
    # blank, title, blank, header, rule and one row: the row without detail is left out
    assert len(lines) == 6
    assert lines[-1] == "| 3b-mb8 | 1.000 | 24.00 | 3.00 | 4.50 | 5.00 | - | gpu 4.50, h2d 0.50 |"
    assert allocator_table([plain]) == []
    # rows measured after a warm-up show what the warm-up had reserved beside it
    warmed = {**measured, "measured_gpu_reserved_warmup_bytes": 6 * GIB}
    assert allocator_table([warmed])[-1] == (
        "| 3b-mb8 | 1.000 | 24.00 | 3.00 | 4.50 | 5.00 | 6.00 | gpu 4.50, h2d 0.50 |")


def event(lane, start, end, step=1):
    return TraceEvent(task_id=f"{lane}{start}", lane=lane, kind="k", block=0, step=step,
                      start_s=start, end_s=end)


def test_busy_time_counts_overlapping_lanes_once_and_skips_the_warm_up_step():
    trace = Trace(source="simulated", label="t", events=(
        event("nvme_read", 0.0, 2.0), event("nvme_write", 1.0, 3.0),  # 3 s together
        event("nvme_read", 5.0, 6.0), event("nvme_read", 10.0, 20.0, step=0)))
    assert busy_s(trace, ("nvme_read", "nvme_write"), first_step=1) == pytest.approx(4.0)
    assert busy_s(trace, ("gpu",), first_step=1) == 0.0


def test_the_regime_is_the_busiest_lane_group():
    events = (event("gpu", 0.0, 1.0), event("gpu", 1.5, 2.5), event("cpu", 0.0, 1.2),
              event("h2d", 0.0, 0.5))
    assert regime_of(Trace(source="simulated", label="t", events=events), 1) == "GPU"
    # the cast's own worker adds to the CPU's time: 2.4 s against the GPU's 2.0
    with_cast = (*events, event("cpu_cast", 1.2, 2.4))
    assert regime_of(Trace(source="simulated", label="t", events=with_cast), 1) == "CPU"


def judged(label, measured, predicted, regime, runs=None):
    r = row(label, measured, predicted)
    r["predicted_regime"] = regime
    if runs:
        r["measured_step_s_runs"] = runs
    return r


def test_gpu_rows_are_judged_on_their_mean_and_bound_rows_each_on_its_spread_or_5_percent():
    rows = [judged("g1", 1.0, 1.02, "GPU"), judged("g2", 1.0, 0.95, "GPU"),
            # 7% off, but its repeats lie 8% apart: within
            judged("c1", 1.0, 1.07, "CPU", runs=[0.96, 1.0, 1.04]),
            judged("c2", 1.0, 1.06, "CPU", runs=[0.99, 1.01]),  # 6% off, 2% apart: over 5%
            judged("d1", 2.0, 2.08, "disk")]
    verdicts = judge(rows)
    assert verdicts["GPU"]["mean_abs_error"] == pytest.approx(0.035)
    assert verdicts["GPU"]["met"] is False and verdicts["GPU"]["worst_error"] == \
        pytest.approx(-0.05)
    assert verdicts["CPU"]["within"] == 1 and verdicts["CPU"]["met"] is False
    assert verdicts["disk"]["within"] == 1 and verdicts["disk"]["met"] is True
    lines = regime_lines(rows)
    assert lines[0].startswith("- CPU-bound rows (2)") and "1 of 2 rows within" in lines[0]
    assert "GPU-bound rows (2)" in lines[1] and lines[1].endswith("missed")
    assert summarize(rows)["step_s_by_regime"]["disk"]["rows"] == ["d1"]
    assert "| c1 | CPU |" in markdown(rows)


def test_rows_without_a_regime_or_a_prediction_are_left_out_of_the_verdicts():
    overflow = judged("o", 1.0, None, "GPU")
    assert judge([overflow, row("plain", 1.0, 1.0)]) == {}


def adamw(start, end, block=0, step=1):
    return TraceEvent(task_id=f"adamw{block}.{start}", lane="cpu", kind="optimizer_step",
                      block=block, step=step, start_s=start, end_s=end)


def on_lane(lane, start, end):
    return TraceEvent(task_id=f"{lane}.{start}", lane=lane, kind="load_weights", block=0,
                      step=1, start_s=start, end_s=end)


def test_adamw_rates_are_grouped_by_the_copy_lanes_beside_each_task():
    events = (
        adamw(0.0, 1.0), adamw(1.0, 2.0), adamw(2.0, 2.5),  # alone: 100, 100, 200 params/s
        adamw(3.0, 5.0), on_lane("h2d", 3.0, 4.2),  # h2d 60% of it: 50 params/s
        adamw(6.0, 10.0), on_lane("d2h", 6.0, 10.0),  # d2h: 25 params/s
        adamw(11.0, 11.5), on_lane("h2d", 11.0, 11.25), on_lane("h2d", 11.25, 11.5),
        on_lane("d2h", 11.0, 11.45),  # h2d all of it, d2h 90%: both copies, 200 params/s
        adamw(12.0, 13.0), on_lane("h2d", 12.0, 12.2),  # h2d 20%: not clear-cut, left out
        adamw(14.0, 15.0), on_lane("d2h", 14.0, 14.9), on_lane("h2d", 14.0, 14.3),  # the same
        adamw(16.0, 17.0), on_lane("nvme_read", 16.5, 17.0),  # the disk beside it: left out
        adamw(18.0, 19.0), on_lane("cpu_cast", 18.0, 18.1),  # a cast beside it: left out
        adamw(20.0, 21.0, block=2),  # the head's block: not a decoder layer
        adamw(22.0, 23.0, step=0))  # the warm-up step
    trace = Trace(source="measured", label="t", events=events)
    got = adamw_rates_by_company(trace, layer_params=100, num_layers=2, first_step=1)
    assert got == {"alone": {"params_per_s": pytest.approx(100.0), "tasks": 3},
                   "h2d": {"params_per_s": pytest.approx(50.0), "tasks": 1},
                   "d2h": {"params_per_s": pytest.approx(25.0), "tasks": 1},
                   "both copies": {"params_per_s": pytest.approx(200.0), "tasks": 1}}
    assert share_beside(adamw(7.0, 8.0), [on_lane("d2h", 7.0, 7.9)]) == pytest.approx(0.9)
    assert share_beside(adamw(7.0, 8.0), [on_lane("d2h", 6.0, 7.2),
                                          on_lane("d2h", 7.7, 9.0)]) == pytest.approx(0.5)


def test_the_company_table_sets_measured_beside_predicted_rates():
    r = {"label": "8b", "measured_adamw_by_company": {
             "alone": {"params_per_s": 6e9, "tasks": 7},
             "both copies": {"params_per_s": 4.5e9, "tasks": 2}},
         "predicted_adamw_by_company": {"alone": {"params_per_s": 5e9, "tasks": 10},
                                        "d2h": {"params_per_s": 4e9, "tasks": 3}}}
    lines = company_table([r, {"label": "old row"}])
    assert lines[-3] == "| configuration | alone | h2d | d2h | both copies |"
    assert lines[-1] == "| 8b | 6.00 / 5.00 (7) | - | - / 4.00 | 4.50 / - (2) |"
    assert not any("old row" in line for line in lines)
    assert company_table([{"label": "old row"}]) == []


def test_the_gpu_lanes_enqueues_give_lead_duration_and_the_share_the_host_kept_waiting():
    def task(layer, step, start, end, enqueued, kind="backward"):
        return TraceEvent(task_id=f"s{step}.{kind}.{layer}", lane="gpu", kind=kind, block=layer,
                          step=step, start_s=start, end_s=end, dispatch_start_s=enqueued[0],
                          dispatch_end_s=enqueued[1])

    trace = Trace(source="measured", label="x", events=(
        task(0, 0, 0.0, 9.0, (0.0, 9.0)),  # the warm-up step: left out
        # enqueued 4 ms ahead in 2 ms: the stream had work queued before it
        task(0, 1, 1.000, 1.005, (0.996, 0.998)),
        # idle streams that began each task as its enqueue began (one launch later)
        task(1, 1, 1.0101, 1.016, (1.010, 1.0159)),
        task(2, 1, 1.0201, 1.026, (1.020, 1.0258)),
        task(3, 1, 1.030, 1.031, (None, None)),  # not recorded: left out
        task(-1, 1, 1.040, 1.041, (1.0, 1.041)),  # the embedding: left out
        TraceEvent(task_id="s1.opt.0", lane="cpu", kind="optimizer_step", block=0, step=1,
                   start_s=1.0, end_s=1.02)))
    got = gpu_dispatch(trace, num_layers=4, first_step=1)
    assert set(got) == {"backward@gpu"}
    assert got["backward@gpu"]["tasks"] == 3
    assert got["backward@gpu"]["enqueue_s"] == pytest.approx(0.0058)
    assert got["backward@gpu"]["lead_s"] == pytest.approx(0.0001)
    assert got["backward@gpu"]["host_waited_share"] == pytest.approx(2 / 3)
    predicted = {"backward@gpu": {"enqueue_s": 0.0027, "lead_s": 0.002,
                                  "host_waited_share": 0.0, "tasks": 3}}
    lines = dispatch_table([{"label": "qwen4b", "measured_dispatch": got,
                             "predicted_dispatch": predicted}, {"label": "old row"}])
    assert lines[-1] == "| qwen4b | - | 5.8 / 2.7, lead 0.1 / 2.0, 67% / 0% |"
    assert dispatch_table([{"label": "old row"}]) == []
