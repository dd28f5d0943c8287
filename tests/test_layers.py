"""The import layers (docs/development.md, "Layout"): no import cycles between files; contracts catch upward ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).parents[1]
PACKAGES = ("fedvit", "benchmarks")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), i.e. every import circle between files."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles_between_files():
    """Lazy (function-level) imports count too: grimp reads every import statement."""
    graph = grimp.build_graph(*PACKAGES)
    assert import_cycles(graph) == []


def test_the_cycle_finder_sees_a_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "circle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from circle import b\n")
    (pkg / "b.py").write_text("from circle import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles(grimp.build_graph("circle")) == [["circle.a", "circle.b"]]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    linter = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(linter), "--no-cache"], cwd=root, capture_output=True, text=True, check=False)


def test_contracts_hold_and_break_on_an_upward_import(tmp_path):
    """The repository keeps its contracts; the same packages with one upward import break them."""
    assert lint_imports(ROOT).returncode == 0
    # the copy's fedvit at the top of the folder: lint-imports puts its working folder first on sys.path
    shutil.copytree(ROOT / "src" / "fedvit", tmp_path / "fedvit", ignore=shutil.ignore_patterns("__pycache__"))
    skip = shutil.ignore_patterns("__pycache__", "results")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    client = tmp_path / "fedvit" / "clients" / "training.py"
    client.write_text(client.read_text() + "\n\ndef _peek():\n    from fedvit.attacks import april  # noqa: F401\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "fedvit.clients.training -> fedvit.attacks.april" in done.stdout
