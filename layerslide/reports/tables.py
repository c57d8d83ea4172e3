"""Tables from traces and result frames: per-lane utilisation, task lists, predicted vs measured,
and writers for CSV, markdown and the terminal."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from layerslide.reports._common import check_events, ordered_lanes
from layerslide.trace import Trace

TASK_COLUMNS = ["task_id", "lane", "kind", "block", "step", "start_s", "end_s", "duration_s"]


def write_table(df: pd.DataFrame, path_stem: str | Path) -> tuple[Path, Path]:
    """Write `df` to `<path_stem>.csv` and `<path_stem>.md` (markdown); returns both paths."""
    stem = Path(path_stem)
    # Append rather than with_suffix: a stem such as "run.v2" must keep its dot.
    csv_path = stem.parent / f"{stem.name}.csv"
    md_path = stem.parent / f"{stem.name}.md"
    stem.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv_path, index=False)
    md_path.write_text(df.to_markdown(index=False) + "\n")
    return csv_path, md_path


def _float_format(values: pd.Series) -> str:
    """Decimals for a float column: fewer as magnitudes grow (12345, 12.35, 0.1235)."""
    finite = values.dropna().abs()
    finite = finite[finite != math.inf]
    biggest = float(finite.max()) if len(finite) else 0.0
    if biggest >= 1000:
        return ",.0f"
    if biggest >= 1:
        return ".2f"
    return ".4f"


def format_table(df: pd.DataFrame) -> str:
    """`df` as a plain-text table for the terminal, floats rounded per column; index dropped."""
    floatfmt = [
        _float_format(df[col]) if pd.api.types.is_float_dtype(df[col]) else "g"
        for col in df.columns
    ]
    # tabulate prints NaN as "nan"; None becomes missingval (blank).
    cells = df.astype(object).where(df.notna(), None)
    return tabulate(
        cells,
        headers="keys",
        tablefmt="simple",
        showindex=False,
        floatfmt=floatfmt,
        missingval="",
    )


def task_table(trace: Trace) -> pd.DataFrame:
    """One row per event, sorted by start time: TASK_COLUMNS."""
    check_events(trace)
    rows = [
        (e.task_id, e.lane, e.kind, e.block, e.step, e.start_s, e.end_s, e.duration_s)
        for e in trace.events
    ]
    df = pd.DataFrame(rows, columns=TASK_COLUMNS)
    return df.sort_values(["start_s", "end_s"], kind="stable").reset_index(drop=True)


def _union_length_s(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals, overlaps counted once."""
    total_s = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total_s += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total_s += cur_end - cur_start
    return total_s


def lane_summary(
    trace: Trace, *, start_s: float | None = None, end_s: float | None = None
) -> pd.DataFrame:
    """Per lane: tasks touching the window, busy seconds in it (overlaps once), busy fraction.

    The window defaults to the first event's start through the last event's end.
    """
    check_events(trace)
    columns = ["lane", "num_tasks", "busy_s", "busy_fraction"]
    if not trace.events:
        return pd.DataFrame(columns=columns)
    lo_s = min(e.start_s for e in trace.events) if start_s is None else float(start_s)
    hi_s = trace.makespan_s if end_s is None else float(end_s)
    if hi_s <= lo_s:
        raise ValueError(
            f"lane_summary window [{lo_s}, {hi_s}] s is empty; pass end_s greater than start_s"
        )
    rows = []
    for lane in ordered_lanes(trace.lanes):
        clipped = [
            (max(e.start_s, lo_s), min(e.end_s, hi_s))
            for e in trace.events
            if e.lane == lane and e.end_s >= lo_s and e.start_s <= hi_s
        ]
        # A zero-length task at the window's edge counts as a task but adds no busy time.
        busy_s = _union_length_s([(a, b) for a, b in clipped if b > a])
        rows.append((lane, len(clipped), busy_s, busy_s / (hi_s - lo_s)))
    return pd.DataFrame(rows, columns=columns)


def compare_traces(predicted: Trace, measured: Trace) -> pd.DataFrame:
    """Events of two traces joined by task_id (outer join: a task missing from one side has NaN
    there), with duration_error_s = predicted - measured and duration_rel_error relative to the
    measured duration (NaN where that is zero)."""
    sides = {}
    for name, trace in (("predicted", predicted), ("measured", measured)):
        df = task_table(trace)
        dupes = df["task_id"][df["task_id"].duplicated()].unique()
        if len(dupes):
            raise ValueError(
                f"{name} trace {trace.label!r} has repeated task ids {list(dupes[:5])}; "
                "compare_traces needs one event per task_id"
            )
        sides[name] = df.set_index("task_id")
    pred, meas = sides["predicted"], sides["measured"]
    keys = ["lane", "kind", "block", "step"]
    out = pred[keys].combine_first(meas[keys])
    for name, df in sides.items():
        for col in ("start_s", "end_s", "duration_s"):
            out[f"{name}_{col}"] = df[col].reindex(out.index)
    for col in ("block", "step"):
        out[col] = out[col].astype("int64")
    out["duration_error_s"] = out["predicted_duration_s"] - out["measured_duration_s"]
    measured_s = out["measured_duration_s"].where(out["measured_duration_s"] != 0)
    out["duration_rel_error"] = out["duration_error_s"] / measured_s
    # Order by when the task ran (measured first, as that is the reality being explained).
    out["_order_s"] = out["measured_start_s"].fillna(out["predicted_start_s"])
    out = out.sort_values(["_order_s"], kind="stable").drop(columns="_order_s")
    return out.rename_axis("task_id").reset_index()
