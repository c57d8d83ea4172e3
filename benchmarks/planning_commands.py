"""The planning commands as a user runs them, timed side by side in one run: the code before
the best-first search (`--baseline DIR`: a copy of that commit, run with its own PYTHONPATH),
this code with --exhaustive (every candidate simulated), and this code as it is; wall and CPU
seconds each (the command and its worker processes), and whether the answers agree.

    python benchmarks/planning_commands.py --out DIR [--baseline DIR] [--only demo,tune-123b]
        [--no-exhaustive]

Each command's variants run one after the other (baseline, exhaustive, fast), so that they
see the same machine; the load average is recorded before each. The answers compared: tune's
best configuration and tokens/s, what-if's and the purchase question's rows (profile, config,
tokens/s), the demo's tuned configuration and what-if table. Writes DIR/planning_commands.json
and DIR/planning_commands.md (the table and the command).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import record

# name -> (the layerslide command, its kind, the target wall seconds on 2 cores: issue 49)
COMMANDS = {
    "demo": (["demo", "--out", "{tmp}/report"], "demo", 30),
    "tune-123b": (["tune", "--model", "mistral-large-123b", "--profile", "rtx4090-256gb",
                   "--gpu-memory", "24GiB", "--json"], "tune", 20),
    "tune-123b-mi300x": (["tune", "--model", "mistral-large-123b", "--profile", "mi300x",
                          "--json"], "tune", 20),
    "tune-123b-h100-sxm": (["tune", "--model", "mistral-large-123b", "--profile", "h100-sxm",
                            "--json"], "tune", 20),
    "tune-32b": (["tune", "--model", "qwen3-32b", "--profile", "rtx4090-256gb",
                  "--gpu-memory", "24GiB", "--json"], "tune", 20),
    "tune-70b-h100": (["tune", "--model", "llama-3.1-70b", "--profile", "h100-pcie", "--json"],
                      "tune", 20),
    "tune-3b": (["tune", "--model", "llama-3.2-3b", "--profile", "h200-bench", "--json"],
                "tune", 20),
    "tune-8b-h200": (["tune", "--model", "qwen3-8b", "--profile", "h200-bench", "--json"],
                     "tune", 20),
    "whatif-70b": (["whatif", "--model", "llama-3.1-70b", "--json"], "whatif", 30),
    "whatif-123b": (["whatif", "--model", "mistral-large-123b", "--json"], "whatif", 30),
    "purchase-70b": (["whatif", "--model", "llama-3.1-70b", "--target-tokens-per-s", "300",
                      "--json"], "whatif", 60),
}
PICK = ("micro_batch", "grad_accum", "accumulation", "window", "activations", "cast",
        "moments_on_nvme", "master_on_nvme", "weights_on_nvme", "host_grad_buffers",
        "gpu_updated_blocks", "gpu_updated_order", "cpu_nice", "tokens_per_s")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def answer(kind: str, stdout: str, tmp: Path):
    """What a command answered, in a form to compare across its variants."""
    if kind == "demo":
        readme = (tmp / "report" / "README.md").read_text()
        tuned = next(line for line in readme.splitlines() if line.startswith("- Tuned"))
        table = (tmp / "report" / "whatif_profiles.csv").read_text()
        return {"tuned": tuned, "whatif_profiles_csv": table}
    data = json.loads(stdout)
    if kind == "tune":
        best = data["best"]
        return {k: best.get(k) for k in PICK} if best else None
    return [{k: row.get(k) for k in ("profile", "config", "tokens_per_s", "feasible")}
            for row in data["rows"]]


def run_variant(name: str, variant: str, code: Path) -> dict:
    argv, kind, _ = COMMANDS[name]
    with tempfile.TemporaryDirectory() as tmp:
        args = [a.format(tmp=tmp) for a in argv]
        if variant == "exhaustive":
            args.append("--exhaustive")
        env = {**os.environ, "PYTHONPATH": str(code)}
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), _children_cpu_s()
        done = subprocess.run([sys.executable, "-m", "layerslide.cli.main", *args], cwd=code,
                              env=env, capture_output=True, text=True, check=False)
        wall, cpu = time.perf_counter() - wall, _children_cpu_s() - cpu
        ok = done.returncode == 0
        found = answer(kind, done.stdout, Path(tmp)) if ok else None
    print(f"{name} {variant}: {wall:.1f} s wall, {cpu:.1f} s CPU, load {load:.1f}, rc "
          f"{done.returncode}", flush=True)
    return {"variant": variant, "argv": args, "wall_s": wall, "cpu_s": cpu, "load": load,
            "rc": done.returncode, "answer": found,
            "stderr_tail": done.stderr[-2000:] if not ok else ""}


def run_command(name: str, baseline: Path | None, exhaustive: bool = True) -> dict:
    variants = [("baseline", baseline)] if baseline else []
    variants += [("exhaustive", REPO)] if exhaustive else []
    variants += [("fast", REPO)]
    runs = {v: run_variant(name, v, code) for v, code in variants}
    fast = runs["fast"]["answer"]
    return {"command": name, "target_s": COMMANDS[name][2], "runs": runs,
            "same_answer": {v: runs[v]["answer"] == fast for v in runs if v != "fast"}}


def markdown(rows: list[dict], command: str, header: str) -> str:
    variants = [v for v in ("baseline", "exhaustive", "fast") if v in rows[0]["runs"]]
    head = " | ".join(f"{v} wall s (CPU s, load)" for v in variants)
    lines = [f"# Planning commands: {header}", "", f"Command: `{command}`", "",
             f"| command | target s | {head} | fast answer the same as |",
             "| --- | --- | " + " | ".join("---" for _ in variants) + " | --- |"]
    for r in rows:
        cells = " | ".join(
            f"{r['runs'][v]['wall_s']:.1f} ({r['runs'][v]['cpu_s']:.0f}, "
            f"{r['runs'][v]['load']:.1f})" + ("" if r["runs"][v]["rc"] == 0 else
                                               f" rc {r['runs'][v]['rc']}")
            for v in variants)
        same = ", ".join(f"{v}: {'yes' if s else 'NO'}" for v, s in r["same_answer"].items())
        lines.append(f"| `{' '.join(COMMANDS[r['command']][0])}` | {r['target_s']} | {cells} "
                     f"| {same} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for planning_commands.json/.md")
    parser.add_argument("--baseline", default=None,
                        help="a copy of the code before (e.g. `git archive 59c3b8e`), run as is")
    parser.add_argument("--only", default=None,
                        help=f"commands to run, comma-separated (default all: {', '.join(COMMANDS)})")
    parser.add_argument("--no-exhaustive", action="store_true",
                        help="leave out this code's --exhaustive runs (the baseline and the "
                             "fast search only: half the time)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(COMMANDS)
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        parser.error(f"unknown commands {unknown}; choose from {', '.join(COMMANDS)}")
    baseline = Path(args.baseline).resolve() if args.baseline else None
    if baseline is not None and not (baseline / "layerslide" / "cli" / "main.py").is_file():
        parser.error(f"--baseline {args.baseline}: no layerslide/cli/main.py there")
    rows = [run_command(name, baseline, not args.no_exhaustive) for name in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(["benchmarks/planning_commands.py", *sys.argv[1:]])
    header = (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}: "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    head, dirty = record.commit()
    (out / "planning_commands.json").write_text(json.dumps(
        {"command": command, "commit": head, "dirty": dirty,
         "baseline": str(baseline) if baseline else None, "cores": os.cpu_count(),
         "hardware": record.hardware(), "versions": record.versions(), "commands": rows},
        indent=1, default=str) + "\n")
    (out / "planning_commands.md").write_text(markdown(rows, command, header))
    print(markdown(rows, command, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
