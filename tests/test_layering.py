"""The architecture: planner, simulator, hwprofiles, tuner and reports run without torch; the
simulator and the executor never import each other; reports never import planner or simulator."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "layerslide"

BLOCK_TORCH = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError(f"{name} is blocked: this module must not need it")
sys.meta_path.insert(0, _Block())
"""


def test_gpu_free_parts_import_and_run_without_torch():
    code = BLOCK_TORCH + """
import layerslide.hwprofiles, layerslide.planner, layerslide.simulator, layerslide.reports
import layerslide.tuner, layerslide.cli.main
from layerslide.hwprofiles import load_profile
from layerslide.planner import PRESETS, Policy, TrainSpec, build_plan
from layerslide.simulator import simulate
plan = build_plan(PRESETS["llama-3.2-1b"], TrainSpec(micro_batch=2), Policy.of())
assert simulate(plan, load_profile("h200-bench")).step_s > 0
assert not any(m.split(".")[0] in ("torch", "triton") for m in sys.modules)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def imported_modules(subpackage: str) -> set[str]:
    names = set()
    for path in (PACKAGE / subpackage).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_simulator_and_executor_do_not_import_each_other():
    assert not any(m.startswith("layerslide.executor") for m in imported_modules("simulator"))
    if (PACKAGE / "executor").exists():
        assert not any(m.startswith("layerslide.simulator") for m in imported_modules("executor"))


def test_lower_layers_do_not_import_upper_ones():
    forbidden = {
        "hwprofiles": ("layerslide.planner", "layerslide.simulator", "layerslide.tuner",
                       "layerslide.reports", "layerslide.cli"),
        "planner": ("layerslide.simulator", "layerslide.tuner", "layerslide.reports",
                    "layerslide.cli", "layerslide.hwprofiles"),
        "simulator": ("layerslide.tuner", "layerslide.reports", "layerslide.cli"),
        "reports": ("layerslide.planner", "layerslide.simulator", "layerslide.tuner",
                    "layerslide.cli"),
        "tuner": ("layerslide.reports", "layerslide.cli"),
        # the interpreter runs a plan; the run that drives it (and its data) lives above it
        "executor": ("layerslide.training", "layerslide.data", "layerslide.tuner",
                     "layerslide.reports", "layerslide.cli"),
        "data": ("layerslide.training", "layerslide.executor", "layerslide.simulator",
                 "layerslide.tuner", "layerslide.cli"),
        "training": ("layerslide.cli",),
    }
    for sub, banned in forbidden.items():
        bad = [m for m in imported_modules(sub) if m.startswith(banned)]
        assert not bad, f"layerslide.{sub} imports {bad}"


# what the executor may take from the planner: the plan, the model and the settings, as data,
# and the slices each rank owns of a block (sharding: arithmetic on the placement's gpus)
PLANNER_DATA = {"layerslide.planner.plan", "layerslide.planner.model",
                "layerslide.planner.settings", "layerslide.planner.sharding"}


def test_executor_reads_plans_and_never_builds_or_sizes_them():
    planner = {m for m in imported_modules("executor") if m.startswith("layerslide.planner")}
    assert planner <= PLANNER_DATA, f"the executor imports {sorted(planner - PLANNER_DATA)}"


def test_planner_data_definitions_need_no_builder():
    for module in PLANNER_DATA:
        path = PACKAGE / "planner" / f"{module.rsplit('.', 1)[1]}.py"
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        planner = {m for m in names if m.startswith("layerslide.planner")}
        assert planner <= PLANNER_DATA, f"{module} imports {sorted(planner - PLANNER_DATA)}"


def test_kinds_and_lanes_are_defined_once():
    """No module but kinds.py spells out the list of lanes or of task kinds."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "kinds.py":
            continue
        text = path.read_text()
        assert '"gpu", "h2d", "d2h", "cpu"' not in text, path
        assert '"offload_activation",\n' not in text, path


# modules of executor/ that are leaving it (the trainer and what only it uses); the rest is the
# interpreter of plans
LEAVING_EXECUTOR = {"trainer.py", "checkpoint_store.py", "checkpoint_snapshot.py",
                    "evaluation.py", "hf_io.py", "data.py", "data_files.py", "data_formats.py"}
# what the planner decided and wrote into the plan (Placement): the interpreter reads that
PLANNER_ONLY_GROUPS = {"residency", "schedule"}


def planner_only_helpers() -> set[str]:
    """settings.py's functions and Policy properties that read a residency or schedule field:
    reading one of them is reading those groups."""
    tree = ast.parse((PACKAGE / "planner" / "settings.py").read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__") and any(
                isinstance(inner, ast.Attribute) and inner.attr in PLANNER_ONLY_GROUPS
                for inner in ast.walk(node))}


def test_the_executor_reads_no_residency_or_schedule_of_a_policy():
    """The plan is the program: the interpreter follows the placement the planner wrote, and
    never decides again from the policy's residency or schedule."""
    helpers = planner_only_helpers()
    assert {"optimizer_casts", "sums_grads_on_host"} <= helpers  # the scan finds them
    reads = []
    for path in sorted((PACKAGE / "executor").glob("*.py")):
        if path.name in LEAVING_EXECUTOR:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.attr if isinstance(node, ast.Attribute)
                    else node.id if isinstance(node, ast.Name)
                    else node.name if isinstance(node, ast.alias) else None)
            if name in PLANNER_ONLY_GROUPS | helpers:
                reads.append(f"{path.name}:{getattr(node, 'lineno', '?')} {name}")
    assert not reads, f"the executor reads the policy's residency or schedule: {reads}"
