"""A task's life on its node: launch, start, stop, finish, retry, and recovery after crashes.

What runs on the node: the launch jobs the control plane queues for the node (its agent runs
them: ``jobs``), the signals it sends, and reconciliation; what a supervisor reports goes
through ``scheduling.agentapi.reports``.
Each is idempotent: a duplicate delivery, a retried report or a reconciliation racing the
supervisor changes nothing the second time.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from gpuplatform.db import Query, server_bound_cursor
from gpuplatform.procid import ProcessId
from nodeagent.launcher import cgroups, procs, supervisor, tracking, unitcgroup, wire
from nodeagent.launcher.environ import platform_environment
from scheduling import estate, paths, reasons
from scheduling.agentapi.messages import Assignment
from scheduling.agentapi.reports import attempt_finished
from scheduling.controls import requeue_lost
from scheduling.models import Task, TaskAttempt
from scheduling.states import HOLDS_GPUS, TaskState

logger = logging.getLogger(__name__)

# A launch that has not produced a supervisor after this long is tried again by reconciliation.
LAUNCH_PATIENCE = timedelta(seconds=30)


# --- Launch (runs on the node) -----------------------------------------------------------------


def launch(task_id: int, attempt_no: int) -> str:
    """Start a supervisor for this attempt, once, however often the launch is delivered."""
    return launch_many([(task_id, attempt_no)])[0]


def launch_many(
    pairs: list[tuple[int, int]], *, node: str = "", may_fork: bool = True
) -> list[str]:
    """``launch`` for each (task id, attempt number) placed on ``node`` ('': any node): one
    statement reads them all and records the attempts that may start (``_LAUNCH``), then a
    supervisor is started for each attempt it recorded (``may_fork``: see
    ``spawn_supervisor``)."""
    query = launch_query(pairs, node)
    with server_bound_cursor() as cursor:
        cursor.execute(query.sql, query.params)
        rows = cursor.fetchall()
    results, recorded = launch_assignments(pairs, rows, node)
    start_supervisors(recorded, may_fork=may_fork)
    return results


def launch_query(pairs: list[tuple[int, int]], node: str) -> Query:
    """``_LAUNCH`` for these (task id, attempt number) on ``node`` ('': any node)."""
    return Query(
        _LAUNCH,
        {
            "tasks": [task_id for task_id, _ in pairs],
            "numbers": [attempt_no for _, attempt_no in pairs],
            "node": node,
            "logs": str(Path(settings.TASK_LOG_DIR)),  # as paths.log_path writes it
            "now": timezone.now(),
        },
    )


def launch_assignments(
    pairs: list[tuple[int, int]], rows: list[tuple], here: str
) -> tuple[list[str], list[Assignment]]:
    """What ``launch_query`` read: what became of each pair, in order, and the assignments of
    the attempts it recorded (to ``start_supervisors``)."""
    by_pair = {(row[0], row[15]): row for row in rows}
    fence_after_s = estate.config().heartbeat.fence_after_s  # for each supervisor's lease
    results: list[str] = []
    recorded: list[Assignment] = []
    seen: set[tuple[int, int]] = set()
    for task_id, attempt_no in pairs:
        row = by_pair.get((task_id, attempt_no))
        if row is None or row[1] != TaskState.SCHEDULED or row[2] != attempt_no:
            results.append("stale: the task moved on")
            continue
        (_, _, _, _, node, tenant, unix_user, name, command, workdir, timeout_s, env, resources,
         service, gpu_uuids, _, attempt_id, log) = row  # fmt: skip
        if here and here != node:
            results.append(f"refused: this is {here}, the task was placed on {node}")
            continue
        if attempt_id is None or (task_id, attempt_no) in seen:
            results.append("duplicate: already launched")  # a repeated delivery, or pair
            continue
        seen.add((task_id, attempt_no))
        results.append("launched")
        recorded.append(
            Assignment(
                attempt_id=attempt_id,
                task_id=task_id,
                attempt_no=attempt_no,
                node=node,
                tenant=tenant,
                unix_user=unix_user,
                task_name=name,
                command=command,
                workdir=workdir,
                log_path=log,
                timeout_s=timeout_s,
                env=json.loads(env) or {},
                resources=json.loads(resources or "null") or {},
                gpu_uuids=gpu_uuids,
                service=json.loads(service or "null"),
                fence_after_s=fence_after_s,
            )
        )
    return results, recorded


def start_supervisors(recorded: list[Assignment], *, may_fork: bool = True) -> None:
    """A supervisor for each recorded attempt, its log's directories made first. ``may_fork``:
    False in a process that runs threads (the node agent's relay), see ``spawn_supervisor``."""
    for assignment in recorded:
        try:
            prepare_logs(assignment)
        except OSError as exc:
            # A full, read-only or vanished log disk costs the task its output, never its
            # start: its supervisor drops the output, says so and has the node's alert raised.
            logger.error("cannot make the log directory of %s: %s", assignment, exc)
        spawn_supervisor(assignment, may_fork=may_fork)


# Tenants' log directories this process made or found: made once, not looked for again on
# every launch (the mkdir calls of each attempt, most of which found the directory there, showed
# in a node agent's profile).
_TENANT_LOG_DIRS: set[Path] = set()


def prepare_logs(assignment: Assignment) -> None:
    """Make the directories of the attempt's log (and its supervisor's)."""
    log = Path(assignment.log_path)
    tenant_dir = log.parent.parent
    if tenant_dir in _TENANT_LOG_DIRS:
        try:
            log.parent.mkdir(mode=0o700, exist_ok=True)
            return
        except FileNotFoundError:  # removed since (an operator cleaning up): made again
            _TENANT_LOG_DIRS.discard(tenant_dir)
    tenant_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # TASK_LOG_DIR
    tenant_dir.mkdir(mode=0o700, exist_ok=True)  # the tenant's: root's alone
    log.parent.mkdir(mode=0o700, exist_ok=True)
    _TENANT_LOG_DIRS.add(tenant_dir)


def supervisor_sink(assignment: Assignment) -> Path:
    """Where the supervisor of ``assignment`` logs (made only if it has something to say)."""
    out = paths.attempt_dir(assignment.tenant, assignment.task_id)
    return out / f"supervisor-{assignment.attempt_no}.log"


# Each task asked for with what its supervisor needs (``messages.Assignment``): its node, its
# tenant's name and Unix user, and the UUIDs of the GPUs its current attempt holds, in index
# order; and the attempt, recorded in the same statement where the task is still placed for
# that attempt (on this node) and no launch recorded it before, with its id and log
# path (``paths.log_path``, written here). Plain SQL: Django compiling the read (joins, an
# aggregate with a filter and an order) was most of a launch job's own CPU. One statement, not a
# read and then an insert: those were two of a launch job's four (with the broker's claim and
# acknowledgement), each a round trip on a busy machine.
# The arrays are read through scalar subqueries so that the planner sizes them the same way
# whether it sees their values or not: seeing them, it estimated each call's plan cheaper than
# the statement's generic plan and planned every call again (pg_prepared_statements showed no
# generic plans). Now it keeps the generic plan after five calls, and a launch plans nothing.
_LAUNCH = """
    WITH w AS (SELECT DISTINCT * FROM unnest((SELECT %(tasks)s::bigint[]),
                                             (SELECT %(numbers)s::integer[]))
                                   AS w(task_id, number)),
    t AS (SELECT t.id, t.state, t.attempt, n.id AS node_id, n.name AS node, e.name AS tenant,
                 e.unix_user, t.name, t.command, t.workdir, t.timeout_s, t.env::text,
                 (t.spec -> 'resources')::text, (t.spec -> 'service')::text,
                 ARRAY(SELECT g.uuid FROM scheduling_allocation a
                         JOIN scheduling_gpu g ON g.id = a.gpu_id
                        WHERE a.task_id = t.id AND a.attempt = t.attempt AND a.released_at IS NULL
                        ORDER BY g.index) AS gpu_uuids,
                 w.number AS wanted
            FROM w
            JOIN scheduling_task t ON t.id = w.task_id
            JOIN tenants_tenant e ON e.id = t.tenant_id
            LEFT JOIN scheduling_node n ON n.id = t.node_id),
    made AS (INSERT INTO scheduling_taskattempt
                    (task_id, number, node_id, gpu_uuids, log_path, launched_by, supervisor_pid,
                     supervisor_started, pid, pid_started, stop_requested, created_at,
                     started_at, ended_at, exit_code, outcome)
             SELECT id, attempt, node_id, to_jsonb(gpu_uuids),
                    concat_ws('/', %(logs)s::text, tenant, id, 'attempt-' || attempt || '.log'),
                    %(node)s::text, NULL, NULL, NULL, NULL, '', %(now)s, NULL, NULL, NULL, ''
               FROM t
              WHERE state = 'scheduled' AND attempt = wanted
                AND (%(node)s::text = '' OR node = %(node)s::text)
             ON CONFLICT (task_id, number) DO NOTHING
             RETURNING id, task_id, number, log_path)
    SELECT t.*, made.id, made.log_path
      FROM t LEFT JOIN made ON made.task_id = t.id AND made.number = t.wanted
"""


def spawn_supervisor(assignment: Assignment, *, may_fork: bool = True) -> None:
    """Start the supervisor fully detached: its own session, not our child once we return.

    By default the node's spawner forks it (``spawner``: a small process, so a fork is cheap),
    or this process when no spawner listens (Django is loaded already, which a fresh interpreter
    would spend far longer importing), unless ``may_fork`` is False: a process with other
    threads (the node agent, whose relay hands attempts on) must not fork, since the child
    would inherit locks those threads hold (logging's, a database connection's) with nobody to
    release them; it starts a new interpreter then, as ``SUPERVISOR_START=exec`` always does.
    """
    sink = supervisor_sink(assignment)
    if settings.SUPERVISOR_START == "fork":
        try:
            wire.request(assignment, str(sink))
            return
        except wire.NotSent:
            if may_fork:  # no spawner here (yet): this worker forks it
                _fork_supervisor(assignment, sink)
                return
    argv = [
        sys.executable,
        "-m",
        "nodeagent.launcher.supervisor",
        str(assignment.task_id),
        str(assignment.attempt_no),
    ]
    environ = platform_environment(PYTHONUNBUFFERED="1")
    try:
        handle = open(sink, "ab")
    except OSError:  # the log disk failed: the supervisor's lines are lost, not its task
        handle = open(os.devnull, "ab")
    with handle:
        # setsid -f forks, so the supervisor is re-parented at once and never lingers as a
        # zombie of this worker; its session also keeps it out of our process group.
        subprocess.run(  # noqa: S603 - fixed argv
            ["setsid", "-f", *argv],  # noqa: S607
            cwd=settings.BASE_DIR,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=True,
        )


def _fork_supervisor(assignment: Assignment, sink) -> None:
    """Double fork: the first child starts a new session and exits at once (we reap it), so
    the supervisor, its child, is nobody's zombie, in nobody's process group, and in no
    platform process's tree (as the spawner's, ``spawner.Spawner.fork``)."""
    _warm_before_fork(assignment.node)
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    code = 1
    try:
        # What the parent made is the child's to read, not to collect: a collection walking it
        # would write to (and so copy) every page of the parent's heap.
        gc.freeze()
        _forget_inherited_connections()
        os.setsid()
        if os.fork() == 0:
            procs.detach_standard_streams()  # not the launch worker's (the agent's) output
            supervisor.become(assignment, sink)  # never returns
        code = 0
    finally:
        os._exit(code)


def _warm_before_fork(node_name: str) -> None:
    """Load once, in the long-lived parent, what each supervisor would otherwise load for
    itself: libc for prctl, and the channel layer it reports live events through (importing
    channels_postgres would otherwise cost CPU in every supervisor), and where a supervisor
    goes to leave the agent's systemd unit (``unitcgroup``)."""
    from channels.layers import get_channel_layer

    procs.warm()
    get_channel_layer()
    unitcgroup.prepared(settings.CGROUP_NAME, node_name)


# The parent's database sessions, as the forked child inherited them. The child opens its own;
# these are kept referenced and never closed here (closing would end the session for the parent,
# which goes on using it: it would otherwise have to close and reconnect before every fork).
_INHERITED: list = []


def _forget_inherited_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _INHERITED.append(conn.connection)
            conn.connection = None


SIGNALS = {"stop": signal.SIGTERM, "pause": signal.SIGUSR1, "resume": signal.SIGUSR2}


def control(task_id: int, attempt_no: int, action: str) -> str:
    """On the node: signal the attempt's supervisor; if it is gone, settle the attempt.

    The attempt's row stays locked until the signal is sent, so its end cannot be recorded
    meanwhile: a supervisor goes on to another attempt (``spawner``) only once its end is
    recorded, so a signal meant for this attempt never reaches the next one."""
    with transaction.atomic():
        attempt = (
            TaskAttempt.objects.select_for_update()
            .filter(task_id=task_id, number=attempt_no)
            .first()
        )
        if attempt is None or attempt.outcome:
            return "nothing to do"
        supervisor = _supervisor(attempt)
        if supervisor is not None:
            os.kill(supervisor.pid, SIGNALS[action])
            return f"sent {action}"
    return reconcile_attempt(attempt)


def current_attempt(task: Task) -> TaskAttempt | None:
    return TaskAttempt.objects.filter(task=task, number=task.attempt).first()


def _supervisor(attempt: TaskAttempt) -> ProcessId | None:
    if attempt.supervisor_pid is None or attempt.supervisor_started is None:
        return None
    supervisor = ProcessId(attempt.supervisor_pid, attempt.supervisor_started)
    return supervisor if supervisor.alive() else None


# --- Reconciliation (node agent start, and periodically) ---------------------------------------


def reconcile_attempt(attempt: TaskAttempt) -> str:
    """Settle an attempt whose supervisor is not running: from its exit record, or as lost once
    every process it left is proven gone (its GPUs are offered again only then)."""
    task = attempt.task
    if attempt.supervisor_pid is None and timezone.now() - attempt.created_at < LAUNCH_PATIENCE:
        # Even with an exit record: a command over at once has its start reported with its end
        # (``supervisor.START_GRACE_S``), after the record is written.
        return "launching"
    record = paths.read_exit_record(paths.exit_path(task.tenant.name, task.pk, attempt.number))
    if record is not None:
        return attempt_finished(
            task.pk,
            attempt.number,
            record.get("exit_code"),
            timed_out=record.get("timed_out", False),
            problem=record.get("problem", ""),
            note=record.get("note", ""),
            unhealthy=record.get("unhealthy", ""),
            fenced_s=record.get("fenced_s"),
        )
    main = ProcessId(attempt.pid, attempt.pid_started) if attempt.pid else None
    if not tracking.kill_orphaned_attempt(attempt.node.name, task.pk, attempt.number, main):
        _unkillable(attempt)
        return "stuck"
    requeue_lost(task, not_adopted_reason(attempt))
    return "lost"


def not_adopted_reason(attempt: TaskAttempt) -> reasons.Reason:
    """Why an attempt left running on its node could not be adopted: the supervisor holds
    the task's output pipe and records its end, so an attempt without one is stopped."""
    where = {"attempt": attempt.number, "node": attempt.node.name}
    if attempt.supervisor_pid is None:
        return reasons.Reason("supervisor_gone_before_start", where)
    return reasons.Reason("supervisor_gone", where)


def _unkillable(attempt: TaskAttempt) -> None:
    """Processes that survive SIGKILL: the node is unhealthy; the task keeps its GPUs (nothing
    else may start there) until they are gone, and a person is told."""
    from monitoring import services as alerts
    from monitoring.models import AlertKind, Severity

    message = (
        f"node {attempt.node.name}: processes of task {attempt.task_id} attempt "
        f"{attempt.number} survive SIGKILL after their supervisor died; its GPUs stay held"
    )
    logger.error(message)
    alerts.alert_raise(
        kind=AlertKind.TASK_LOST,
        severity=Severity.CRITICAL,
        message=message,
        task=attempt.task,
        node=attempt.node,
    )


def reconcile_node(node_name: str, *, startup: bool = False) -> dict[str, int]:
    """What the database thinks runs on this node, checked against what really runs here.

    Also kills what must not run: the cgroups of attempts that are over or unknown, and (at
    start-up, where the fallback has no cgroups to look at) supervisors of finished attempts.
    """
    counts = {"adopted": 0, "finished": 0, "lost": 0, "relaunched": 0, "stuck": 0}
    tasks = Task.objects.filter(node__name=node_name, state__in=HOLDS_GPUS).select_related(
        "tenant", "node"
    )
    for task in tasks:
        attempt = current_attempt(task)
        if attempt is None:
            if task.state == TaskState.SCHEDULED and (
                timezone.now() - (task.scheduled_at or timezone.now()) > LAUNCH_PATIENCE
            ):
                launch(task.pk, task.attempt)
                counts["relaunched"] += 1
            continue
        if attempt.outcome:
            continue
        if _supervisor(attempt) is not None:
            counts["adopted"] += 1
            continue
        result = reconcile_attempt(attempt)
        if result in ("lost", "stuck"):
            counts[result] += 1
        elif result != "launching":
            counts["finished"] += 1
    counts["swept"] = sweep_stale_attempts(node_name, startup=startup)
    return counts


def watch_supervisors(node_name: str) -> int:
    """A quick look: the running attempts of this node whose supervisor died are settled now,
    not at the next reconciliation. One query when all is well. Returns how many were settled.
    (The node agent looks every second through a ``SupervisorWatch``, which spares the query.)"""
    rows = watched_supervisors(node_name)
    return _settle_dead([pk for pk, pid, started in rows if not ProcessId(pid, started).alive()])


def _settle_dead(dead: list[int]) -> int:
    for attempt in TaskAttempt.objects.filter(pk__in=dead).select_related("task__tenant", "node"):
        if not attempt.outcome and _supervisor(attempt) is None:
            reconcile_attempt(attempt)
    return len(dead)


class SupervisorWatch:
    """``watch_supervisors`` for the node agent's loop, which looks every second: the list of
    supervisors to watch (``watched_supervisors``) is read from the database only when it may
    have changed, and each look checks their processes on this host alone, so an idle node
    makes no query. The agent calls ``changed()`` after whatever can change the list: a job
    run (a launch, a control), a report its relay wrote (a start, an end, a hand-off), a
    reconciliation (which also makes it a backstop, for a supervisor that wrote its reports
    itself). A supervisor found dead is settled only once a fresh read still lists it."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._rows: list[tuple[int, int, float]] | None = None  # None: read at the next look
        self.reads = 0

    @property
    def stale(self) -> bool:
        """Whether the next look reads the database."""
        return self._rows is None

    def changed(self) -> None:
        self._rows = None

    def look(self) -> int:
        """Settle the attempts whose supervisor died; returns how many."""
        fresh = self._rows is None
        if fresh:
            self._read()
        dead = self._dead()
        if dead and not fresh:  # the list may be out of date: settle only what it still holds
            self._read()
            dead = self._dead()
        if not dead:
            return 0
        self._rows = None  # what was settled left the list
        return _settle_dead(dead)

    def _read(self) -> None:
        self._rows = list(watched_supervisors(self.node_name))
        self.reads += 1

    def _dead(self) -> list[int]:
        return [pk for pk, pid, started in self._rows or () if not ProcessId(pid, started).alive()]


def watched_supervisors(node_name: str):
    """(attempt id, supervisor pid, its start time) of the node's running attempts: read through
    the attempts' (node, outcome) index, so each read (the agent's, after a change) reads those
    alone, not the node's whole history of finished ones."""
    return (
        TaskAttempt.objects.filter(
            node__name=node_name,
            outcome="",
            number=F("task__attempt"),
            task__state__in=HOLDS_GPUS,
            supervisor_pid__isnull=False,
        )
        .order_by()  # in any order: the model's ordering would join and sort for nothing
        .values_list("pk", "supervisor_pid", "supervisor_started")
    )


def sweep_stale_attempts(node_name: str, *, startup: bool = False) -> int:
    """No process of a finished (or unknown) attempt outlives it. Returns how many were killed."""
    found = tracking.hierarchy()
    if found is None:
        return _stop_stale_supervisors(node_name) if startup else 0
    names = cgroups.list_children(found, settings.CGROUP_NAME, node_name)
    keys = {key: name for name in names if (key := tracking.parse_cgroup_name(name))}
    if not keys:
        return 0
    live = {
        (task_id, number)
        for task_id, number, pid, started, created in TaskAttempt.objects.filter(
            node__name=node_name, task_id__in={t for t, _ in keys}, outcome=""
        ).values_list("task_id", "number", "supervisor_pid", "supervisor_started", "created_at")
        if (pid and ProcessId(pid, started).alive())
        or (pid is None and timezone.now() - created < LAUNCH_PATIENCE)
    }
    killed = 0
    for key, name in keys.items():
        if key in live:
            continue
        group = cgroups.AttemptCgroup.find(found, settings.CGROUP_NAME, node_name, name)
        if group is None:
            continue
        if not group.is_empty():
            logger.warning("node %s: killing the processes left in cgroup %s", node_name, name)
            killed += 1
        if group.kill():
            group.remove()
    return killed


def _stop_stale_supervisors(node_name: str) -> int:
    """Supervisors still alive for attempts that are over (requeued while this node was cut
    off): they would stop themselves at their next fence; make it now."""
    stale = TaskAttempt.objects.filter(
        node__name=node_name,
        supervisor_pid__isnull=False,
        ended_at__gte=timezone.now() - timedelta(days=1),
    ).exclude(outcome="")
    stopped = 0
    for task_id, number, pid, started in stale.values_list(
        "task_id", "number", "supervisor_pid", "supervisor_started"
    ):
        if procs.supervising(ProcessId(pid, started), task_id, number):
            os.kill(pid, signal.SIGTERM)
            stopped += 1
    return stopped
