"""The package's shape: lines per top-level folder and every function over 80 lines.
usage: python scripts/code_shape.py [REPO_ROOT]  (default: this checkout)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LONG_LINES = 80


def main(root: Path) -> None:
    package = root / "layerslide"
    folders: dict[str, int] = {}
    long: list[tuple[int, str]] = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(package)
        folder = rel.parts[0] if len(rel.parts) > 1 else "(top)"
        folders[folder] = folders.get(folder, 0) + len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > LONG_LINES:
                    long.append((length, f"{rel}:{node.name}"))
    for folder, lines in sorted(folders.items()):
        print(f"{folder:12} {lines:6}")
    print(f"{'total':12} {sum(folders.values()):6}")
    for length, name in sorted(long, reverse=True):
        print(f"{length:4} {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
