import ast
from pathlib import Path

import layerslide.reports

FORBIDDEN = ("torch", "layerslide.simulator", "layerslide.planner", "matplotlib.pyplot")


def test_reports_read_traces_only():
    package_dir = Path(layerslide.reports.__file__).parent
    for path in package_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
