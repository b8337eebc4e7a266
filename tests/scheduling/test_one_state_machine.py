"""One state machine: ``scheduling.transitions`` is the only module that writes a task's state,
and PostgreSQL refuses a move that ``states.TRANSITIONS`` does not allow, raw SQL included."""

from __future__ import annotations

import ast
import importlib
import re
from itertools import product
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction

from scheduling import states, transitions
from scheduling.models import Task
from scheduling.states import IllegalTransition, TaskState
from tests.factories import TaskFactory

ROOT = Path(__file__).resolve().parents[2]
STATE_MODULE = ROOT / "scheduling" / "transitions.py"
TABLE = {(a.value, b.value) for a, targets in states.TRANSITIONS.items() for b in targets}

# --- The database's guard ----------------------------------------------------------------------


def test_the_migration_holds_the_table_of_legal_moves():
    """The trigger's moves are written out in its migration (migrations are frozen): a change
    of the table needs a new migration, and this test then points at it."""
    migration = importlib.import_module("scheduling.migrations.0022_task_legal_moves_trigger")
    assert set(migration.LEGAL) == TABLE
    assert len(migration.LEGAL) == len(TABLE)  # no pair twice


def test_the_database_refuses_an_illegal_raw_update(db):
    task = TaskFactory(state=TaskState.SUCCEEDED)
    refusal = rf"a task cannot go from succeeded to running \(task {task.pk}\)"
    with (
        pytest.raises(IntegrityError, match=refusal),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE scheduling_task SET state = 'running' WHERE state = 'succeeded'")
    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED


def test_the_database_lets_a_legal_raw_update_through(db):
    task = TaskFactory(state=TaskState.PENDING)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE scheduling_task SET state = 'scheduled' WHERE id = %s", [task.pk])
        assert cursor.rowcount == 1
    task.refresh_from_db()
    assert task.state == TaskState.SCHEDULED


def test_the_database_allows_exactly_the_moves_of_the_table(db):
    tasks = {state: TaskFactory(state=state).pk for state in TaskState}
    allowed = set()
    for from_state, to_state in product(TaskState, TaskState):
        if from_state == to_state:
            continue
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE scheduling_task SET state = %s WHERE id = %s",
                    [to_state.value, tasks[from_state]],
                )
                allowed.add((from_state.value, to_state.value))
                raise _Undo
        except _Undo:
            pass
        except IntegrityError as exc:
            assert f"cannot go from {from_state} to {to_state}" in str(exc)
    assert allowed == TABLE


class _Undo(Exception):
    """Rolls a savepoint back after a move that went through."""


def test_one_statement_with_one_illegal_move_moves_nothing(db):
    pending, succeeded = TaskFactory(state="pending"), TaskFactory(state="succeeded")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_task SET state = 'cancelled' WHERE id = ANY(%s)",
            [[pending.pk, succeeded.pk]],
        )
    assert set(Task.objects.values_list("state", flat=True)) == {"pending", "succeeded"}


def test_a_bulk_move_is_checked_against_the_table_when_it_is_built():
    with pytest.raises(IllegalTransition, match="cannot go from succeeded to running"):
        transitions.moved(
            "k", TaskState.SUCCEEDED, TaskState.RUNNING, source="r", where="k.id = r.id"
        )


def test_a_bulk_move_writes_what_a_move_of_one_task_writes(db):
    """The same columns, the same event, the GPUs released, whichever way a task moves."""
    one, many = TaskFactory(state="running"), TaskFactory(state="running")
    transitions.task_transition(task=one, to_state="succeeded", reason="exited with 0")
    sql = f"""
        WITH r AS (SELECT unnest(%(ids)s::bigint[]) AS id),
        {
        transitions.moved(
            "k",
            TaskState.RUNNING,
            TaskState.SUCCEEDED,
            source="r",
            where="k.id = r.id",
            reason="'exited with 0'",
        )
    }
        SELECT id FROM k
    """  # noqa: S608 - the test's constant text
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": [many.pk], "now": one.updated_at})
        assert cursor.fetchall() == [(many.pk,)]
    fields = ("state", "reason", "wait", "wait_digest", "finished_at", "updated_at")
    rows = Task.objects.filter(pk__in=[one.pk, many.pk]).order_by("pk").values(*fields)
    assert rows[0] == rows[1]
    events = [task.events.values("from_state", "to_state", "reason", "at").get()
              for task in (one, many)]  # fmt: skip
    assert events[0] == events[1]


# --- No other module writes a task's state -----------------------------------------------------

SKIPPED = {".git", ".venv", "tests", "node_modules", "static", "templates", "locale", "docs"}
# Benchmarks seed history (tasks that ran, ended) as tests do: an INSERT is no move, and the
# trigger guards moves. They may create tasks in any state, but move none.
SEEDS = {"bench"}
TASK_WORD = re.compile(r"task", re.IGNORECASE)
OTHER_WORD = re.compile(r"gpu|node", re.IGNORECASE)
PENDING = ("pending", "TaskState.PENDING", "TaskState.PENDING.value", "S.PENDING")
UPDATE_TASK = re.compile(
    r"\bUPDATE\s+(?:ONLY\s+)?\"?scheduling_task\"?(?!\w)(?P<sets>.*?)"
    r"(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|\Z)",
    re.IGNORECASE | re.DOTALL,
)
SETS_STATE = re.compile(r"(?<![\w.\"])(?:\w+\.)?\"?state\"?\s*=", re.IGNORECASE)


def shipped_files() -> list[Path]:
    """Every shipped Python file but the state module and the migrations."""
    files = []
    for top in sorted(ROOT.iterdir()):
        if top.name.startswith(".") or top.name in SKIPPED:
            continue
        candidates = [top] if top.suffix == ".py" else sorted(top.rglob("*.py"))
        files += [
            path
            for path in candidates
            if "migrations" not in path.parts and path != STATE_MODULE and path.is_file()
        ]
    return files


def _chain_names(node: ast.AST) -> list[str]:
    """The names along ``a.b(...).c[...]``: its receiver chain, not its arguments."""
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return [*names, node.id]
        else:
            return names


def _of(node: ast.AST, scope: Scope) -> str:
    """Whose state ``node`` holds, by its names: "task", "other" (GPUs, nodes) or "unknown".
    ``self`` is named by its class, and an argument by its annotation when it has one."""
    names = _chain_names(node)
    if names and names[-1] == "self" and scope.classes:
        names[-1] = scope.classes[-1]
    elif names and names[-1] in scope.annotations:
        names[-1] = scope.annotations[names[-1]]
    if any(TASK_WORD.search(name) for name in names):
        return "task"
    if any(OTHER_WORD.search(name) for name in names):
        return "other"
    return "unknown"


class Scope:
    """Where the visitor is: its classes, and the annotated arguments of its functions."""

    def __init__(self) -> None:
        self.classes: list[str] = []
        self.annotations: dict[str, str] = {}


def _state_keyword(call: ast.Call) -> ast.expr | None:
    """The value given for ``state`` (as a keyword, or in a ``**{...}``), or None."""
    for keyword in call.keywords:
        if keyword.arg == "state":
            return keyword.value
        if keyword.arg is None and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "state":
                    return value
    return None


def _names_state(node: ast.AST | None) -> bool:
    """A list or tuple of field names that holds "state"."""
    return isinstance(node, ast.List | ast.Tuple | ast.Set) and any(
        isinstance(item, ast.Constant) and item.value == "state" for item in node.elts
    )


def _sql_text(node: ast.Constant | ast.JoinedStr) -> str:
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)


class StateWrites(ast.NodeVisitor):
    """Finds the writes of a task's state in one module's source."""

    def __init__(self, seeds: bool) -> None:
        self.seeds = seeds  # may create tasks in any state
        self.found: list[tuple[int, str]] = []
        self.scope = Scope()

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append((node.lineno, what))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.classes.append(node.name)
        self.generic_visit(node)
        self.scope.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = self.scope.annotations
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        self.scope.annotations = outer | {
            arg.arg: ast.unparse(arg.annotation) for arg in arguments if arg.annotation
        }
        self.generic_visit(node)
        self.scope.annotations = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else None
        value = _state_keyword(node)
        receiver = func.value if isinstance(func, ast.Attribute) else None
        whose = _of(receiver, self.scope) if receiver is not None else "unknown"
        if method in ("update", "update_or_create") and whose != "other":
            if value is not None:
                self.flag(node, f".{method}(state=...)")
            elif whose == "task" and any(k.arg is None for k in node.keywords):
                self.flag(node, f".{method}(**...) of tasks")
        if method in ("update_or_create", "get_or_create") and whose != "other":
            for keyword in node.keywords:
                if keyword.arg in ("defaults", "create_defaults") and isinstance(
                    keyword.value, ast.Dict
                ):
                    keys = [k.value for k in keyword.value.keys if isinstance(k, ast.Constant)]
                    if "state" in keys:
                        self.flag(node, f".{method}({keyword.arg}={{'state': ...}})")
        if method == "bulk_update" and whose != "other":
            fields = node.args[1] if len(node.args) > 1 else None
            fields = next((k.value for k in node.keywords if k.arg == "fields"), fields)
            if _names_state(fields):
                self.flag(node, ".bulk_update(..., ['state', ...])")
        if method == "save" and whose != "other":
            fields = next((k.value for k in node.keywords if k.arg == "update_fields"), None)
            if _names_state(fields):
                self.flag(node, ".save(update_fields=['state', ...])")
        created = (isinstance(func, ast.Name) and func.id == "Task") or (
            method in ("create", "get_or_create") and whose == "task"
        )
        if created and value is not None and not self.seeds:
            if ast.unparse(value).strip("'\"") not in PENDING:
                self.flag(node, f"a task created {ast.unparse(value)}")
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "state"
            and _of(node.args[0], self.scope) != "other"
        ):
            self.flag(node, "setattr(..., 'state', ...)")
        self.generic_visit(node)

    def _assigned(self, targets: list[ast.expr], node: ast.AST) -> None:
        for target in targets:
            for item in ast.walk(target):
                if (
                    isinstance(item, ast.Attribute)
                    and item.attr == "state"
                    and isinstance(item.ctx, ast.Store)
                    and _of(item.value, self.scope) != "other"
                ):
                    self.flag(node, f"{ast.unparse(item)} = ...")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned([node.target], node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned([node.target], node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._sql(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._sql(node)  # as a whole: its constant parts are not read again one by one
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                self.visit(part)

    def _sql(self, node: ast.Constant | ast.JoinedStr) -> None:
        for match in UPDATE_TASK.finditer(_sql_text(node)):
            if SETS_STATE.search(match["sets"]):
                self.flag(node, "UPDATE scheduling_task SET state")


def state_writes(source: str, *, seeds: bool = False) -> list[tuple[int, str]]:
    visitor = StateWrites(seeds)
    visitor.visit(ast.parse(source))
    return visitor.found


def test_no_module_but_the_state_module_writes_a_tasks_state():
    files = shipped_files()
    assert STATE_MODULE.exists()
    assert ROOT / "scheduling" / "scheduler.py" in files  # the scan sees the shipped code
    assert ROOT / "nodeagent" / "agent.py" in files
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in files
        for line, what in state_writes(
            path.read_text(), seeds=path.relative_to(ROOT).parts[0] in SEEDS
        )
    ]
    assert found == [], "a task's state is written outside scheduling/transitions.py"


def test_the_state_module_is_seen_writing_states():
    """The scan finds what the state module does, so it would find it anywhere else."""
    found = {what for _, what in state_writes(STATE_MODULE.read_text())}
    assert ".update(**...) of tasks" in found
    assert "UPDATE scheduling_task SET state" in found


WRITES = [
    'Task.objects.filter(pk=1).update(state="running")',
    "Task.objects.filter(pk=1).update(**{'state': 'running', 'reason': ''})",
    "Task.objects.filter(pk=1).update(**updates)",
    'tasks.update(state=TaskState.FAILED, reason="x")',
    'Task.objects.filter(node=node).update(state="lost")',
    "Task.objects.update_or_create(pk=1, defaults={'state': 'failed'})",
    "Task.objects.bulk_update(tasks, ['state', 'reason'])",
    'task.state = "running"\ntask.save()',
    "self.task.state = TaskState.RUNNING",
    'task.state = "running"\ntask.save(update_fields=["state"])',
    "setattr(task, 'state', 'running')",
    "def go(obj: Task) -> None:\n    obj.state, obj.reason = 'failed', ''",
    "def go(obj) -> None:\n    obj.state = 'failed'",
    "class TaskRow:\n    def go(self):\n        self.state = 'running'",
    'Task.objects.create(tenant=t, state="running")',
    "Task(tenant=t, state=TaskState.RUNNING)",
    'cursor.execute("UPDATE scheduling_task SET state = %s WHERE id = %s", ["x", 1])',
    "SQL = '''UPDATE scheduling_task AS k\n SET reason = '', k.state = 'failed'\n FROM r'''",
    'SQL = f"""WITH k AS (UPDATE "scheduling_task" t SET wait = \'{{}}\', state = {x})"""',
    "cursor.execute('update scheduling_task set STATE=%s', ['x'])",
]

NOT_WRITES = [
    "GPU.objects.filter(pk__in=ids).update(state=GpuState.OFFLINE)",
    'Node.objects.filter(state="available").update(state="offline")',
    "GPU.objects.filter(node=node, allocations__task=task).update(state='failed')",
    'node.state = NodeState.DRAINING\nnode.save(update_fields=["state"])',
    'self.gpu.state = "failed"',
    "class NodeRow:\n    def go(self):\n        self.state = 'offline'",
    "def resume(obj: Node | GPU) -> None:\n    obj.state, obj.reason = obj.resume_state, ''",
    "setattr(gpu, 'state', 'failed')",
    'Task.objects.filter(state="pending").update(reason="x")',
    "Task.objects.filter(pk=1).update(priority=3, updated_at=now)",
    "Task.objects.filter(state=TaskState.PENDING).count()",
    'Task(tenant=t, name="n")',
    "Task(tenant=t, state=TaskState.PENDING)",
    'UPDATE = "UPDATE scheduling_taskattempt SET state = 1"',
    'SQL = "UPDATE scheduling_task SET reason = %s, resume_state = 1 WHERE state = %s"',
    'SQL = "UPDATE scheduling_gpu SET state = %s WHERE id = %s"',
    "SQL = 'SELECT id FROM scheduling_task WHERE state = %s'",
    "SimpleNamespace(pk=1, state=TaskState.RUNNING)",
    'events.append(dict(state="running"))',
]


@pytest.mark.parametrize("source", WRITES)
def test_the_scan_finds_a_write_of_a_tasks_state(source):
    assert state_writes(source), source


@pytest.mark.parametrize("source", NOT_WRITES)
def test_the_scan_leaves_other_states_and_reads_alone(source):
    assert state_writes(source) == [], source


def test_benchmarks_may_seed_tasks_in_any_state_but_move_none():
    assert state_writes('Task(tenant=t, state="succeeded")', seeds=True) == []
    assert state_writes('Task.objects.filter(pk=1).update(state="x")', seeds=True)
