"""`python -m benchmarks`: every suite lists, every case's steps check out on the CPU (scripts
and flags exist, layerslide commands parse), a suite is added by one module, and a run writes
one self-describing result JSON."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import registry
from benchmarks.__main__ import main

REQUIRED = {"validation", "compare", "executor", "kernels", "nvme", "sim-speed"}


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_list_names_every_suite_and_case():
    done = bench("--list")
    assert done.returncode == 0, done.stderr
    suites = registry.discover()
    assert REQUIRED <= set(suites)
    for suite in suites.values():
        assert f"{suite.name}: " in done.stdout
        assert suite.cases, suite.name
        for case in suite.cases:
            assert f"    {case.name} [{case.needs}" in done.stdout


def test_dry_run_of_every_suite_checks_out():
    done = bench("--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every step checks out" in done.stdout
    for suite in registry.discover().values():
        for case in suite.cases:
            assert f"{suite.name}/{case.name} [" in done.stdout
        assert f"benchmarks/results/{suite.name}/" in done.stdout


def test_each_suite_dry_runs_alone():
    for name in registry.discover():
        assert main([name, "--dry-run"]) == 0, name


def test_current_results_named_by_suites_exist():
    for suite in registry.discover().values():
        if suite.current:
            assert (REPO / suite.current).exists(), (suite.name, suite.current)


def current_result_files() -> list[str]:
    """Every file a current figure comes from: the suites' and the README table's."""
    spec = importlib.util.spec_from_file_location("results_table",
                                                  REPO / "scripts" / "results_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return ([s.current for s in registry.discover().values() if s.current]
            + [f"benchmarks/results/{row[-1]}" for row in table.ROWS])


def test_results_show_the_current_record_per_suite_and_archive_the_rest():
    """benchmarks/results/ holds the suites' records, the folders the current figures come from
    and archive/; everything else from before the suites is in archive/, a line each in its
    index."""
    results = REPO / "benchmarks" / "results"
    current = {Path(f).relative_to("benchmarks/results").parts[0]
               for f in current_result_files()}
    allowed = {"README.md", "archive", *registry.discover(), *current}
    assert {p.name for p in results.iterdir()} <= allowed
    archive = results / "archive"
    index = (archive / "README.md").read_text()
    archived = sorted(p.name for p in archive.iterdir() if p.name != "README.md")
    assert archived and not set(archived) & current
    for name in archived:
        assert index.count(f"| [{name}]({name}) |") == 1, f"{name} has no line in the index"
    assert index.count("\n| [") == len(archived)


def test_dry_run_finds_what_would_fail():
    assert registry.check_step(["python3", "benchmarks/sim_speed.py", "--no-such-flag"]) == [
        "benchmarks/sim_speed.py defines no --no-such-flag"]
    assert registry.check_step(["python3", "benchmarks/nothing.py"]) == [
        "script benchmarks/nothing.py is not in the repository"]
    assert registry.check_step(["python3", "-m", "layerslide.cli.main", "train", "--stepz", "3"])
    assert not registry.check_step(["python3", "-m", "layerslide.cli.main", "simulate",
                                    "--model", "llama-3.2-3b", "--profile", "h200-bench"])
    assert registry.check_step(["bash", "benchmarks/run_nothing.sh"])
    case = registry.Case("bad", "a typo", (registry.step("{pyhton} benchmarks/sim_speed.py"),))
    problems = registry.check_case(registry.Suite("s", "", (case,)), case)
    assert problems and "unknown placeholder" in problems[0]
    case = registry.Case("p", "a profile that is not there",
                         (registry.step("{python} benchmarks/sim_speed.py"),),
                         profile="no-such-profile")
    problems = registry.check_case(registry.Suite("s", "", (case,)), case)
    assert problems and "profile 'no-such-profile'" in problems[0]


@pytest.fixture
def dropped_suite(tmp_path, monkeypatch):
    """A suite module dropped into a folder on the suites package's path."""
    from benchmarks import suites

    (tmp_path / "tiny_probe.py").write_text(
        "from benchmarks.registry import Case, Suite, step\n"
        "SUITE = Suite('tiny', 'a suite added by one module', (Case('version', 'pytest --version',"
        " (step('{python} -m pytest --version', timeout_s=60),), needs='cpu'),))\n")
    monkeypatch.setattr(suites, "__path__", [*suites.__path__, str(tmp_path)])
    yield
    sys.modules.pop("benchmarks.suites.tiny_probe", None)


def test_a_dropped_module_is_a_suite_and_a_run_records_itself(dropped_suite, tmp_path, capsys):
    assert "tiny" in registry.discover()
    assert main(["--list"]) == 0
    assert "tiny: a suite added by one module" in capsys.readouterr().out
    assert main(["tiny", "--dry-run"]) == 0
    out, scratch = tmp_path / "run", tmp_path / "nvme"
    assert main(["tiny", "--out", str(out), "--nvme-dir", str(scratch)]) == 0
    assert scratch.is_dir() and not any(scratch.iterdir())  # the case's folder is gone
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["suite"] == "tiny" and record["cases"][0]["ok"]
    assert record["cases"][0]["steps"][0]["rc"] == 0
    assert record["commit"] and record["date"] and record["versions"]["python"]
    assert {"torch", "triton", "transformers", "driver"} <= set(record["versions"])
    assert {"cpus", "gpus"} <= set(record["hardware"])
    assert "profile" in record and record["command"].startswith("python -m benchmarks tiny")
