"""Readers of the files the benchmark scripts write, for the suites' `summarize`."""

from __future__ import annotations

import json
from pathlib import Path


def json_file(out: Path, name: str) -> object:
    return json.loads((out / name).read_text())


def validation(out: Path) -> dict:
    data = json_file(out, "validation_summary.json")
    return {"configurations": data["configurations"],
            "step_mean_abs_error": data["step_s"]["mean_abs_error"],
            "step_worst_error": data["step_s"]["worst_error"],
            "spearman": data["step_s"]["spearman"],
            "gpu_allocated_mean_abs_error": data["gpu_allocated_bytes"]["mean_abs_error"],
            "host_mean_abs_error": data["host_bytes"]["mean_abs_error"],
            "tuned_vs_best_measured": data["tuned_vs_best_measured"]}


def compare(out: Path) -> dict:
    rows = json_file(out, "compare.json")
    return {f"{r['system']} mb{r['micro_batch']}": r.get("step_s") for r in rows}


def executor(out: Path) -> dict:
    return {"rows": json_file(out, "executor_bench.json")}
