"""The launcher's modules depend on each other one way: ``lifecycle`` starts supervisors, and
the supervisor reports through ``reports`` without ever importing ``lifecycle``."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduling.launcher

LAUNCHER = Path(scheduling.launcher.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_supervisor_never_imports_lifecycle():
    assert "scheduling.launcher.lifecycle" not in imported_modules(LAUNCHER / "supervisor.py")


def test_the_reports_never_import_lifecycle_or_the_supervisor():
    imported = imported_modules(LAUNCHER / "reports.py")
    assert "scheduling.launcher.lifecycle" not in imported
    assert "scheduling.launcher.supervisor" not in imported


def test_lifecycle_imports_the_supervisor_at_the_top():
    top = {
        node.module
        for node in ast.parse((LAUNCHER / "lifecycle.py").read_text()).body
        if isinstance(node, ast.ImportFrom)
    }
    assert {"scheduling.launcher.supervisor", "scheduling.launcher.reports"} <= top
