"""bench/ never imports the test suite: benchmarks run from a checkout without depending on
test helpers (shared pieces live in the server or client package, e.g. lane.server.testing)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_benchmark_imports_the_tests() -> None:
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0] == "tests"]
    assert found == []
