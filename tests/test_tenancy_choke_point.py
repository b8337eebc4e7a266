"""Tenant data reaches views, serializers and consumers only through selectors that take the
tenant (``tenant=``), never through a model's manager, a hand-written tenant filter or raw SQL
in the view itself. An AST scan of every such module: a new ``Task.objects.filter(...)`` in a
view fails here, naming the file and line.

What a view module is: any ``api*.py``, ``views*.py``, ``consumers*.py``, ``serializers*.py``
or ``context*.py`` of the platform's own apps (or a module inside a package of that name). The
Django admin is not one: it is the operators' own window on every tenant's rows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VIEW_NAMES = ("api", "views", "consumers", "serializers", "context")
# The rows a tenant owns: read only through selectors (scheduling, monitoring, tenants).
TENANT_MODELS = {"Task", "TaskAttempt", "Allocation", "Alert", "ApiToken"}
MANAGERS = {"objects", "_default_manager", "_base_manager"}
FETCHERS = {"get_object_or_404", "get_list_or_404", "aget_object_or_404", "aget_list_or_404"}
QUERY_METHODS = {
    "filter", "exclude", "get", "aget", "get_or_create", "update_or_create", "Q", "annotate",
    "aggregate", "values", "values_list",
}  # fmt: skip
RAW_SQL = {"cursor", "raw", "extra", "server_bound_cursor", "execute"}
# (module, text of the problem): why it may stay.
ALLOWED = {
    ("gpuplatform/views.py", "cursor()"): "the readiness probe's SELECT 1 reads no table",
    ("gpuplatform/views.py", "execute()"): "the readiness probe's SELECT 1 reads no table",
}


def view_modules() -> list[Path]:
    skip = {".venv", "tests", "migrations", "node_modules", "var", "static", "bench"}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if skip & set(parts) or len(parts) < 2:
            continue
        named = [path.stem, *parts[:-1][1:]]  # the module, or a package it sits in
        if any(name.split("_")[0] in VIEW_NAMES for name in named):
            found.append(path)
    return found


def _tenant_lookup(keyword: str | None) -> bool:
    return keyword is not None and bool({"tenant", "tenant_id"} & set(keyword.split("__")))


def _names(node: ast.AST) -> set[str]:
    """The model names an expression may stand for: ``Task``, ``models.Task``."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def problems(source: str, filename: str = "<view>") -> list[str]:
    """Each place ``source`` reads tenant rows other than through a selector, as
    ``file:line: what``."""
    tree = ast.parse(source, filename)
    aliases = set(TENANT_MODELS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            aliases |= {a.asname for a in node.names if a.name in TENANT_MODELS and a.asname}
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in MANAGERS:
            model = _names(node.value) & aliases
            if model:
                # ``Model.objects.none()`` reads no row (what a schema generator is handed).
                parent = parents.get(node)
                call = parents.get(parent)
                empty = (
                    isinstance(parent, ast.Attribute)
                    and parent.attr == "none"
                    and isinstance(call, ast.Call)
                    and not call.args
                )
                if not empty:
                    say(node, f"{model.pop()}.{node.attr}: read it through a selector")
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else None
            callee = callee or (node.func.id if isinstance(node.func, ast.Name) else None)
            if callee in FETCHERS and node.args and _names(node.args[0]) & aliases:
                say(node, f"{callee}({ast.unparse(node.args[0])}, ...): use a selector")
            if callee in QUERY_METHODS:
                for keyword in node.keywords:
                    if _tenant_lookup(keyword.arg):
                        on = ast.unparse(node.func)
                        say(node, f"{on}({keyword.arg}=...): a tenant filter by hand")
            if callee in RAW_SQL:
                say(node, f"{callee}(): raw SQL in a view; put the read in a selector")
        elif isinstance(node, ast.Compare) and not all(
            isinstance(op, ast.Is | ast.IsNot) for op in node.ops
        ):
            sides = [node.left, *node.comparators]
            if any(
                isinstance(s, ast.Attribute) and s.attr in ("tenant", "tenant_id") for s in sides
            ):
                say(node, f"{ast.unparse(node)}: a tenant filter by hand")
    return found


def test_views_serializers_and_consumers_read_tenant_rows_only_through_selectors():
    modules = view_modules()
    names = {str(path.relative_to(ROOT)) for path in modules}
    # The scan covers what it says it does (a renamed folder would make it pass on nothing).
    assert {
        "scheduling/api.py", "tenants/api.py", "telemetry/api.py", "monitoring/api.py",
        "gpuplatform/api.py", "portal/views.py", "portal/consumers.py", "portal/context.py",
        "live/views.py", "live/consumers.py",
    } <= names, sorted(names)  # fmt: skip
    found = []
    for path in modules:
        module = str(path.relative_to(ROOT))
        found += [
            problem
            for problem in problems(path.read_text(), module)
            if not any(module == where and text in problem for where, text in ALLOWED)
        ]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "Task.objects.filter(pk=1)",
        "tasks = TaskAttempt.objects.all()",
        "Allocation._default_manager.count()",
        "models.Alert.objects.first()",
        "get_object_or_404(ApiToken, pk=1)",
        "selectors.task_list(tenant=t).filter(owner__tenant=other)",
        "Membership.objects.filter(tenant=t)",
        "Q(task__tenant_id=1)",
        "mine = [a for a in gpu.allocations if a.task.tenant_id == tenant_id]",
        "connection.cursor()",
        "Task.objects.none().union(Task.objects.all())",
    ],
)
def test_the_scan_catches_a_read_that_bypasses_the_selectors(line):
    source = f"from scheduling.models import Task, TaskAttempt, Allocation\n{line}\n"
    assert problems(source), line


def test_the_scan_follows_an_imported_alias():
    assert problems("from scheduling.models import Task as T\nT.objects.get(pk=1)\n")


@pytest.mark.parametrize(
    "line",
    [
        "selectors.task_get(tenant=caller.tenant, pk=pk)",
        "services.membership_change(tenant=tenant, user=user, role=role)",
        "Task.objects.none()",
        "GPU.objects.all()",
        "selectors.task_list(tenant=t).filter(pk__in=ids)",
        "class Meta:\n    model = Task",
    ],
)
def test_the_scan_lets_reads_through_selectors_pass(line):
    assert problems(f"from scheduling.models import Task, GPU\n{line}\n") == []
