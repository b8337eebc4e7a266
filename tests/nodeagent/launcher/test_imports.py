"""The launcher's modules depend on each other one way: ``lifecycle`` starts supervisors, and
the supervisor reports through ``scheduling.agentapi.reports`` without ever importing
``lifecycle``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import nodeagent.launcher
import scheduling.agentapi

LAUNCHER = Path(nodeagent.launcher.__file__).parent


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
    assert "nodeagent.launcher.lifecycle" not in imported_modules(LAUNCHER / "supervisor.py")


def test_the_reports_never_import_the_node_agent():
    """They are the control plane's side of the agent's interface (scheduling.agentapi)."""
    reports = Path(scheduling.agentapi.__file__).parent / "reports.py"
    assert not {name for name in imported_modules(reports) if name.startswith("nodeagent")}


def test_lifecycle_imports_the_supervisor_at_the_top():
    top = set()
    for node in ast.parse((LAUNCHER / "lifecycle.py").read_text()).body:
        if isinstance(node, ast.ImportFrom):
            top.add(node.module)
            top.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert {"nodeagent.launcher.supervisor", "scheduling.agentapi.reports"} <= top


def test_the_spawner_and_its_supervisors_load_no_models():
    """What makes the spawner small: it reads the settings, never Django's apps or models."""
    probe = (
        "import sys; from nodeagent.launcher import spawner; spawner.warm(); "
        "from django.apps import apps; "
        "print(apps.ready, sorted(m for m in sys.modules if m.endswith('.models')))"
    )
    done = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", probe],
        cwd=LAUNCHER.parent.parent,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "gpuplatform.settings"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split("\n")[0] == "False []", done.stdout + done.stderr
