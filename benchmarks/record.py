"""What a run records about itself: the result JSON every `python -m benchmarks SUITE` writes.

    benchmarks/results/<suite>/<date>-<commit>.json     the record (benchmarks/__main__.py writes it)
    benchmarks/results/<suite>/<date>-<commit>/<case>/  what each case's steps wrote

The commit comes from git, or from $LAYERSLIDE_COMMIT where the copy has no git history (a
device machine given the working tree); `dirty` says whether tracked files differed from it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.registry import REPO

LIBRARIES = ("torch", "triton", "transformers", "simpy", "deepspeed", "liger-kernel")


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> tuple[str, bool | None]:
    """(short commit, dirty) of the checkout, or $LAYERSLIDE_COMMIT and None without git."""
    head = _run(["git", "rev-parse", "--short=7", "HEAD"])
    if head is None:
        return os.environ.get("LAYERSLIDE_COMMIT", "unknown"), None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head, bool(status)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    smi = shutil.which("nvidia-smi") and _run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    found["driver"] = smi.splitlines()[0] if smi else None
    return found


def hardware() -> dict:
    info: dict = {"machine": platform.machine(), "cpus": os.cpu_count(), "node": platform.node()}
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        info["ram_bytes"] = int(meminfo[0].split()[1]) * 1024
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    smi = shutil.which("nvidia-smi") and _run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    info["gpus"] = smi.splitlines() if smi else []
    return info


def result_paths(suite: str, results: Path, date: str, head: str) -> tuple[Path, Path]:
    """(record file, output folder) of a run: <results>/<suite>/<date>-<commit>[.json]."""
    stem = f"{date}-{head}"
    return results / suite / f"{stem}.json", results / suite / stem


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
