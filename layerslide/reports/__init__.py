"""Reports: tables, figures and Perfetto/Chrome trace JSON from Traces and result frames.

Reads Traces and pandas DataFrames only; never imports the planner, simulator or torch.
"""

from layerslide.reports.figures import (
    plot_memory,
    plot_purchase,
    plot_timeline,
    plot_tuning_heatmap,
    plot_whatif,
)
from layerslide.reports.perfetto import (
    trace_to_chrome_json,
    traces_to_chrome_json,
    write_chrome_trace,
)
from layerslide.reports.tables import (
    compare_traces,
    format_table,
    lane_summary,
    task_table,
    write_table,
)

__all__ = [
    "compare_traces",
    "format_table",
    "lane_summary",
    "plot_memory",
    "plot_purchase",
    "plot_timeline",
    "plot_tuning_heatmap",
    "plot_whatif",
    "task_table",
    "trace_to_chrome_json",
    "traces_to_chrome_json",
    "write_chrome_trace",
    "write_table",
]
