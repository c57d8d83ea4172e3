"""Suites and cases: what `python -m benchmarks` runs.

A **suite** is one module in `benchmarks/suites/` that defines `SUITE = Suite(...)`; dropping a
module there is all it takes to add one (they are found by `discover()`, nothing lists them).
A **case** is a named list of **steps**, each an argv run in a fresh process from the
repository root. An argv may hold placeholders, filled in when the case runs:

  {python}    the interpreter running `python -m benchmarks`
  {out}       this case's output folder (benchmarks/results/<suite>/<date>-<commit>/<case>/)
  {nvme_dir}  a new, empty folder on the drive under test, removed after the case
              (under --nvme-dir / $LAYERSLIDE_NVME_DIR, else a temporary folder)
  {profile}   the hardware profile the case runs on (--profile, else the case's default)

`--dry-run` checks every step without running it: the script or module is in the repository,
the placeholders are known, every `--flag` a step passes to a benchmark script is one the
script's argparse defines, and `layerslide` commands parse under the real CLI parser.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLACEHOLDERS = ("python", "out", "nvme_dir", "profile")
NEEDS = ("cpu", "gpu")


@dataclass(frozen=True)
class Step:
    """One process: `argv` (placeholders allowed), killed after `timeout_s`."""

    argv: tuple[str, ...]
    timeout_s: int = 600

    def filled(self, values: dict[str, str]) -> list[str]:
        return [arg.format_map(values) for arg in self.argv]


def step(command: str, timeout_s: int = 600) -> Step:
    """A step from a shell-like string: `step("{python} benchmarks/sim_speed.py --out {out}")`."""
    return Step(tuple(shlex.split(command)), timeout_s)


@dataclass(frozen=True)
class Case:
    """A named measurement: its steps run in order; a failing step ends the case."""

    name: str
    what: str
    steps: tuple[Step, ...]
    needs: str = "gpu"          # "cpu": runs anywhere; "gpu": needs a CUDA GPU
    profile: str | None = None  # the profile its predictions use, when it is not calibrated
    packages: tuple[str, ...] = ()  # what it needs beyond layerslide[executor] (wheels folder)
    # the figure(s) a finished case reports, read from its output folder (into the result JSON)
    summarize: Callable[[Path], dict] | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    what: str
    cases: tuple[Case, ...]
    # the result the README's and results README's current figure comes from (repo-relative)
    current: str | None = None
    reproduce: str = ""  # a sentence on how to run it and what a run needs
    module: str = field(default="", compare=False)

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"suite {self.name!r} has no case {name!r} "
                       f"(cases: {', '.join(c.name for c in self.cases)})")


def discover() -> dict[str, Suite]:
    """Every suite module in benchmarks/suites/, by suite name."""
    from benchmarks import suites

    found: dict[str, Suite] = {}
    for info in sorted(pkgutil.iter_modules(suites.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"benchmarks.suites.{info.name}")
        suite = getattr(module, "SUITE", None)
        if not isinstance(suite, Suite):
            raise TypeError(f"benchmarks/suites/{info.name}.py defines no SUITE = Suite(...)")
        if suite.name in found:
            raise ValueError(f"suite {suite.name!r} defined twice "
                             f"({found[suite.name].module} and {info.name})")
        found[suite.name] = Suite(suite.name, suite.what, suite.cases, suite.current,
                                  suite.reproduce, module=info.name)
    return found


# --- dry run -------------------------------------------------------------------------------

def script_flags(path: Path) -> set[str] | None:
    """The --flags a Python script's argparse defines (None: it uses none we can read)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    flags: set[str] = set()
    uses_argparse = False
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            uses_argparse = True
            flags.update(a.value for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith("-"))
    return flags if uses_argparse else None


def _check_layerslide(argv: list[str]) -> list[str]:
    from layerslide.cli.main import build_parser

    parser = build_parser()
    parser.exit = _raise_exit  # type: ignore[method-assign]
    parser.error = _raise_error  # type: ignore[method-assign]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():
            sub.exit, sub.error = _raise_exit, _raise_error
    try:
        parser.parse_args(argv)
    except _ParseFailed as failed:
        return [f"layerslide {' '.join(argv)}: {failed}"]
    return []


class _ParseFailed(Exception):
    pass


def _raise_exit(status: int = 0, message: str | None = None):
    raise _ParseFailed(message or f"exit {status}")


def _raise_error(message: str):
    raise _ParseFailed(message)


def check_step(argv: list[str]) -> list[str]:
    """What is wrong with one filled-in step (empty: nothing found)."""
    problems: list[str] = []
    if not argv:
        return ["an empty step"]
    rest = argv[1:]
    if argv[0] == "bash":
        script = REPO / rest[0]
        if not script.is_file():
            problems.append(f"bash script {rest[0]} is not in the repository")
        return problems
    if rest[:2] == ["-m", "layerslide.cli.main"]:
        return _check_layerslide(rest[2:])
    if rest[:2] == ["-m", "pytest"]:
        paths = [a for a in rest[2:] if a.startswith("tests")]
        return [f"test path {p} is not in the repository" for p in paths
                if not (REPO / p.split("::")[0]).exists()]
    if rest and rest[0].endswith(".py"):
        script = REPO / rest[0]
        if not script.is_file():
            return [f"script {rest[0]} is not in the repository"]
        flags = script_flags(script)
        if flags is not None:
            for arg in rest[1:]:
                flag = arg.split("=", 1)[0]
                if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in flags:
                    problems.append(f"{rest[0]} defines no {flag}")
        return problems
    return [("a step must run a repository script, `-m layerslide.cli.main`, `-m pytest` or "
             f"`bash SCRIPT`: {shlex.join(argv)}")]


def check_case(suite: Suite, case: Case) -> list[str]:
    problems = []
    if case.needs not in NEEDS:
        problems.append(f"needs={case.needs!r} is not one of {NEEDS}")
    if not case.steps:
        problems.append("no steps")
    if case.profile is not None:
        from layerslide.hwprofiles import load_profile

        try:
            load_profile(case.profile)
        except (ValueError, OSError) as error:
            problems.append(f"profile {case.profile!r}: {error}")
    for s in case.steps:
        names = {m.group(1) for a in s.argv for m in re.finditer(r"\{(\w+)\}", a)}
        unknown = names - set(PLACEHOLDERS)
        if unknown:
            problems.append(f"unknown placeholder(s) {sorted(unknown)} in {shlex.join(s.argv)}")
            continue
        problems.extend(check_step(s.filled(sample_values(case))))
    return [f"{suite.name}/{case.name}: {p}" for p in problems]


def sample_values(case: Case) -> dict[str, str]:
    return {"python": "python3", "out": "OUT", "nvme_dir": "NVME_DIR",
            "profile": case.profile or "OUT/calibrated.toml"}
