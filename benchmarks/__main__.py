"""python -m benchmarks [--list] [--dry-run] [SUITE [CASE ...]] [--out DIR] [--wheels DIR] ...

    python -m benchmarks --list                 the suites and their cases
    python -m benchmarks --dry-run              check every case of every suite (no GPU needed)
    python -m benchmarks executor --dry-run     print what the executor suite would run
    python -m benchmarks executor sweep         run one case; writes the suite's result JSON

A run writes benchmarks/results/<suite>/<date>-<commit>.json (suite, cases, commands, exit
codes, wall times, each case's summary, hardware, versions, commit, profile) and the cases'
own files in the folder of the same name. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import record
from benchmarks.registry import REPO, Case, Suite, check_case, discover


def list_suites(suites: dict[str, Suite]) -> None:
    for suite in suites.values():
        print(f"{suite.name}: {suite.what}")
        for case in suite.cases:
            extra = f", needs {', '.join(case.packages)}" if case.packages else ""
            print(f"    {case.name} [{case.needs}{extra}]: {case.what}")


def dry_run(suites: list[Suite], cases: list[str], values: dict[str, str],
            outs: dict[str, Path]) -> int:
    problems: list[str] = []
    for suite in suites:
        values = {**values, "out": str(outs[suite.name])}
        chosen = [suite.case(c) for c in cases] if cases else list(suite.cases)
        for case in chosen:
            print(f"{suite.name}/{case.name} [{case.needs}]: {case.what}")
            filled = {**values, "out": str(Path(values["out"]) / case.name),
                      "profile": values.get("profile") or case.profile
                      or str(Path(values["out"]) / case.name / "calibrated.toml")}
            for s in case.steps:
                print(f"    {shlex.join(s.filled(filled))}   (timeout {s.timeout_s} s)")
            found = check_case(suite, case)
            problems.extend(found)
            for p in found:
                print(f"    PROBLEM {p}")
    print(f"{len(problems)} problem(s)" if problems else "dry run: every step checks out")
    return 1 if problems else 0


def install_wheels(folder: Path, target: Path) -> None:
    """Install a folder of wheels (and sdists such as DeepSpeed's) into `target`, offline."""
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    sdists = sorted(str(p) for p in folder.glob("*.tar.gz"))
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--no-cache-dir", "--target", str(target)]
    if wheels:
        subprocess.run([*base, "--upgrade", *wheels], check=True)
    if sdists:
        subprocess.run([*base, "--no-build-isolation", *sdists], check=True)


def run_case(case: Case, values: dict[str, str], env: dict[str, str]) -> dict:
    out = Path(values["out"])
    out.mkdir(parents=True, exist_ok=True)
    # device scripts write to $OUT and keep scratch under $LAYERSLIDE_NVME_DIR
    env = {**env, "OUT": str(out), "LAYERSLIDE_NVME_DIR": values["nvme_dir"]}
    steps = []
    for s in case.steps:
        argv = s.filled(values)
        print(f"== {case.name}: {shlex.join(argv)}", flush=True)
        start = time.monotonic()
        try:
            rc = subprocess.run(argv, check=False, cwd=REPO, env=env,
                                timeout=s.timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        steps.append({"argv": argv, "rc": rc, "wall_s": round(time.monotonic() - start, 3)})
        if rc != 0:
            break
    summary = None
    if case.summarize is not None and all(s["rc"] == 0 for s in steps):
        try:
            summary = case.summarize(out)
        except (OSError, KeyError, TypeError, ValueError) as error:  # the files are the result
            summary = {"error": f"{type(error).__name__}: {error}"}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return {"case": case.name, "what": case.what, "needs": case.needs, "steps": steps,
            "ok": len(steps) == len(case.steps) and all(s["rc"] == 0 for s in steps),
            "summary": summary, "files": files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", nargs="?", help="a suite's name (--list shows them)")
    parser.add_argument("cases", nargs="*", help="cases of the suite to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the suites and their cases")
    parser.add_argument("--dry-run", action="store_true",
                        help="print and check what would run, run nothing (every suite if none "
                             "is named)")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"),
                        help="the folder results go under (default benchmarks/results)")
    parser.add_argument("--out", help="write the run here instead of "
                                      "RESULTS/<suite>/<date>-<commit>[.json]")
    parser.add_argument("--profile", help="the hardware profile for cases that take one "
                                          "(default: each case's, or its own calibration)")
    parser.add_argument("--wheels", default=os.environ.get("LAYERSLIDE_WHEELS"),
                        help="a folder of wheels (simpy, DeepSpeed, liger-kernel...) installed "
                             "offline into a temporary folder on the cases' PYTHONPATH "
                             "($LAYERSLIDE_WHEELS)")
    parser.add_argument("--nvme-dir", default=os.environ.get("LAYERSLIDE_NVME_DIR"),
                        help="a folder on the drive under test ($LAYERSLIDE_NVME_DIR; default a "
                             "temporary folder): each case gets a new subfolder there as "
                             "{nvme_dir}, removed when the case ends")
    args = parser.parse_args(argv)

    suites = discover()
    if args.list:
        list_suites(suites)
        return 0
    if args.suite is not None and args.suite not in suites:
        parser.error(f"no suite {args.suite!r}; suites: {', '.join(suites)}")
    if args.suite is None and not args.dry_run:
        parser.error("name a suite, or give --list or --dry-run")
    if args.cases and args.suite is not None:
        for name in args.cases:
            try:
                suites[args.suite].case(name)
            except KeyError as error:
                parser.error(error.args[0])

    head, dirty = record.commit()
    date = record.today()
    if args.dry_run:
        chosen = [suites[args.suite]] if args.suite else list(suites.values())
        outs = {s.name: Path(args.out) if args.out
                else record.result_paths(s.name, Path(args.results), date, head)[1]
                for s in chosen}
        return dry_run(chosen, args.cases, {"python": sys.executable,
                                            "nvme_dir": args.nvme_dir or "NVME_DIR",
                                            "profile": args.profile or ""}, outs)

    suite = suites[args.suite]
    record_path, out = record.result_paths(suite.name, Path(args.results), date, head)
    if args.out:
        out = Path(args.out)
        record_path = out.with_suffix(".json")
    if record_path.exists():
        parser.error(f"{record_path} exists: give --out, or move it")
    scratch = Path(tempfile.mkdtemp(prefix="layerslide-bench-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LAYERSLIDE_COMMIT": head}
    if args.wheels:  # device scripts (bash steps) install them through device_env.sh too
        env["LAYERSLIDE_WHEELS"] = str(Path(args.wheels).resolve())
    paths = [str(REPO)]
    if args.wheels:
        install_wheels(Path(args.wheels), scratch / "site")
        paths.insert(0, str(scratch / "site"))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    nvme_dir = args.nvme_dir or str(scratch / "nvme")
    Path(nvme_dir).mkdir(parents=True, exist_ok=True)

    started = record.now()
    results = []
    for case in ([suite.case(c) for c in args.cases] if args.cases else suite.cases):
        scratch_dir = Path(nvme_dir) / f"layerslide-{suite.name}-{case.name}"
        if scratch_dir.exists():
            parser.error(f"{scratch_dir} exists: remove it, or give another --nvme-dir")
        scratch_dir.mkdir(parents=True)
        values = {"python": sys.executable, "out": str(out / case.name),
                  "nvme_dir": str(scratch_dir), "profile": args.profile or case.profile
                  or str(out / case.name / "calibrated.toml")}
        try:
            results.append({**run_case(case, values, env), "profile": values["profile"]})
        finally:
            shutil.rmtree(scratch_dir, ignore_errors=True)  # made above, for this case alone
    data = {"suite": suite.name, "what": suite.what, "started": started, "ended": record.now(),
            "date": date, "commit": head, "dirty": dirty,
            "command": shlex.join(["python", "-m", "benchmarks", *(argv or sys.argv[1:])]),
            "hardware": record.hardware(), "versions": record.versions(),
            "profile": args.profile, "outputs": str(out.relative_to(REPO))
            if out.is_relative_to(REPO) else str(out), "cases": results}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {record_path}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
