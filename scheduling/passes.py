"""Asking for a scheduling pass, coalesced.

Every event that can free or need capacity (submit, finish, cancel, node change, quota change)
calls ``request_pass()``. It queues a django-q2 task only if none is queued yet, so a burst of
1,000 submissions queues one pass (plus at most one more that starts after the first began and
sees what arrived meanwhile). A one-minute schedule runs a pass anyway, so a lost request costs
at most a minute.

Time-based waits (a retry backoff ends, a task starts to starve, borrowed GPUs become
reclaimable) wake the scheduler when they are due, not at the next backstop: each pass books one
delayed pass for the earliest such time (``wake_at``). django-q2 cannot delay a task and its
schedules run at most once a minute, but its ORM broker hands a queued row out once the row's
``lock`` time has passed (that is how it re-delivers unacknowledged tasks): a row enqueued with
``lock = due`` is a pass that the scheduler cluster picks up within milliseconds of ``due`` (its
idle pusher waits until the earliest row falls due: gpuplatform/broker.py).
The booking survives restarts (it is a row in PostgreSQL) and a pass booked for a time that
turned out not to matter is just a cheap pass. ``SchedulerState.wake_at`` coalesces: a pass
books a new wake-up only if none is booked at or before the time it needs.

While tasks wait and no GPU is idle, a pass can place nothing new: GPUs come free only when a
task ends, and its node agent hands them to the last pass's successors at once (``launcher.
handoff``). What a pass adds then (new tasks' reasons and places in line, a preemption for a
more important one, successors for a list running short) can wait a moment, so such passes
start at least ``scheduling.busy_pass_gap_ms`` after the last one ended (``defer_while_busy``),
as Slurm's ``sched_min_interval`` spaces its main loop's runs: back to back, a burst of
submissions into a busy estate ran a pass for nearly every one, spending the CPUs the
submissions needed (the throughput bench's busy-estate phase shows the passes per submission).
The pass a submission asks for waits up to the gap: its task could start sooner only by
preempting another.

The backstop schedules (that pass, and the one that notices silent nodes and lost tasks) belong
to the platform: ``backstops_ensure()`` creates them after every ``migrate``, so an install
that never runs the demo ``bootstrap`` command still notices a dead node.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Schedule
from django_q.tasks import async_task

from gpuplatform.broker import NotifyingOrm
from gpuplatform.db import server_bound_cursor
from scheduling import estate
from scheduling.models import PassRequest, SchedulerState, Successor

logger = logging.getLogger(__name__)

# (name, function, minutes): django-q2 runs a Schedule at most once a minute, which is all a
# backstop needs (NOTES.md).
BACKSTOPS = (
    ("mark-silent-nodes", "scheduling.tasks.mark_silent_nodes", 1),
    ("scheduling-pass-backstop", "scheduling.tasks.run_pass", 1),
)


def request_pass(claimed: tuple[int, bool] | None = None) -> None:
    """Queue a pass once the current transaction commits (so the pass sees its writes).

    ``claimed``: what the flag's claim found in a statement of the caller's that has already
    committed (``claim_cte``, CLAIMED): the pass is then queued now if that claim took the flag,
    with no statement of its own."""
    if claimed is not None:
        _queue_if_claimed(*claimed)
    else:
        transaction.on_commit(_enqueue)


def _enqueue() -> None:
    # One statement claims the flag and says whether the row exists (it always does but in a
    # new database): under a burst of submissions or of ends a pass is nearly always queued
    # already, and at idle the claim and the queue's insert are the only two round trips. A
    # pass clears the flag before it reads, so a flag seen set after our commit belongs to a
    # pass that will see our writes.
    with server_bound_cursor() as cursor:  # prepared: under a burst, one per commit
        cursor.execute(_REQUEST_SQL)
        claimed, exists = cursor.fetchone()
    _queue_if_claimed(claimed, exists)


# The flag's claim, for a statement of a caller's own that commits by itself (no transaction
# around it), one round trip fewer than ``request_pass``'s statement after it: a plain
# submission's INSERT, the node agents' statement that records plain ends. The statement takes
# ``claim_cte()`` among its CTEs and CLAIMED in its select list, and the caller passes what they
# say to ``request_pass``.
CLAIMED = """(SELECT count(*) FROM claimed),
             EXISTS (SELECT 1 FROM scheduling_passrequest WHERE id = 1)"""


def claim_cte(when: str = "true") -> str:
    """The CTE ``claimed`` that takes the flag if it is free and ``when`` (an SQL condition,
    which may read the statement's other CTEs) holds."""
    return f"""claimed AS (UPDATE scheduling_passrequest SET queued = true
                           WHERE id = 1 AND NOT queued AND ({when}) RETURNING id)"""  # noqa: S608 - our SQL


_REQUEST_SQL = f"WITH {claim_cte()} SELECT {CLAIMED}"


def _queue_if_claimed(claimed: int, exists: bool) -> None:
    """After a statement with ``claim_cte`` committed: queue a pass if it claimed the flag."""
    if not exists:
        PassRequest.objects.get_or_create(pk=1)
        claimed = PassRequest.objects.filter(pk=1, queued=False).update(queued=True)
    if not claimed:
        return  # queued already, or another process claimed it between our read and update
    # Named, never implied: a process started with Q_CLUSTER_NAME=<node> in its environment
    # would queue it where the node's agent takes jobs, which never runs a pass.
    async_task(
        "scheduling.tasks.run_pass", task_name="scheduling-pass", cluster=scheduler_cluster()
    )
    _watch_for_stall()


# How long a queued pass may take to start before another is run in its place, besides the
# busy gap a pass may be deferred by: a pass normally starts within moments of being queued.
STALL_AFTER_S = 2.0


def _watch_for_stall() -> None:
    """A pass has just been queued: check, a moment later, that some pass started since.

    Two schedulers take passes from one queue. One that dies (or is cut off) after taking a
    queued pass and before starting it leaves the flag set, so every request after that queues
    nothing, and django-q2 hands the dead scheduler's job out again only after its ``retry``
    (minutes): the estate stalled until the one-minute backstop, whichever scheduler was alive.
    The check is a delayed job (``run_if_stalled``) that any live scheduler runs; it runs a pass
    only if the flag is still set and no pass has started since (``PassRequest.started``)."""
    if Conf.SYNC:
        return  # jobs run inline: nothing can die holding one, and nothing would run it
    started = PassRequest.objects.filter(pk=1).values_list("started", flat=True).first()
    gap_s = estate.config().scheduling.busy_pass_gap_ms / 1000
    due = timezone.now() + timedelta(seconds=STALL_AFTER_S + gap_s)
    async_task(
        "scheduling.tasks.run_pass_if_stalled",
        started or 0,
        task_name="scheduling-stall-check",
        sync=False,
        cluster=scheduler_cluster(),
        broker=DelayedOrm(list_key=scheduler_cluster(), due=due),
    )


def stalled(started: int) -> bool:
    """Whether the pass queued when ``started`` passes had started is still queued and not
    started, nor any other pass since."""
    return PassRequest.objects.filter(pk=1, queued=True, started=started).exists()


_BOOK_SQL = """
    WITH booked AS (UPDATE scheduling_schedulerstate SET wake_at = %s
                     WHERE id = 1 AND (wake_at IS NULL OR wake_at <= %s OR wake_at > %s)
                 RETURNING id)
    SELECT (SELECT count(*) FROM booked),
           EXISTS (SELECT 1 FROM scheduling_schedulerstate WHERE id = 1)
"""


def scheduler_cluster() -> str:
    """The queue passes are taken from (``manage.py scheduler``, or django-q2's own
    ``manage.py qcluster`` with no Q_CLUSTER_NAME)."""
    return settings.Q_CLUSTER["name"]


def book_wake_up(when: datetime) -> None:
    """Have a pass run at ``when`` (once the current transaction commits)."""
    transaction.on_commit(lambda: _book(when))


def _book(when: datetime) -> None:
    # Claimed with a conditional UPDATE: of two passes that need the same time, one books it.
    # One statement (a pass books nearly every time: its tasks' starvation limits).
    with connection.cursor() as cursor:
        cursor.execute(_BOOK_SQL, [when, timezone.now(), when])
        booked, exists = cursor.fetchone()
        if not exists:  # a new database: once
            SchedulerState.objects.get_or_create(pk=1)
            cursor.execute(_BOOK_SQL, [when, timezone.now(), when])
            booked, _ = cursor.fetchone()
    if not booked:
        return  # a pass is booked at or before `when`: it books the next one
    _queue_pass_at(when, "scheduling-wake-up")


def _queue_pass_at(due: datetime, name: str) -> None:
    """A pass the scheduler's cluster runs once ``due`` has passed. Always through the broker
    (sync=False even in tests: a delayed pass never runs inline), to the scheduler's cluster by
    name: a pass run by a node's cluster must not queue one there."""
    async_task(
        "scheduling.tasks.run_pass",
        task_name=name,
        sync=False,
        cluster=scheduler_cluster(),
        broker=DelayedOrm(list_key=scheduler_cluster(), due=due),
    )


class DelayedOrm(NotifyingOrm):
    """The platform's broker, enqueueing a row that is handed out only once ``due`` passed
    (the notification makes the idle pusher wait until then rather than its usual second)."""

    def __init__(self, list_key: str, due: datetime) -> None:
        super().__init__(list_key=list_key)
        self.due = due

    def enqueue(self, task: str) -> int:
        return self.insert(task, self.due)


def defer_while_busy(gap_ms: int) -> datetime | None:
    """Called by a pass's job before it runs the pass: when the last pass left tasks waiting,
    no GPU idle and successors still listed for the GPUs that come free, and ended less than
    ``gap_ms`` ago, queue the pass for ``gap_ms`` after it and return that time (the request
    flag stays set, so requests meanwhile queue nothing); otherwise None: run it now. Never
    where jobs run inline (``sync``, tests): nothing would run the delayed one.

    A list handed out to its end runs the pass at once: ends then free GPUs that nobody takes
    until the next pass."""
    if gap_ms <= 0 or Conf.SYNC:
        return None
    last = (
        SchedulerState.objects.filter(pk=1)
        .annotate(listed=Exists(Successor.objects.all()))
        .values_list("last_pass_at", "last_pass_ms", "last_waiting", "last_idle_gpus", "listed")
        .first()
    )
    if last is None:
        return None
    started, took_ms, waiting, idle, listed = last
    if started is None or not waiting or idle or not listed:
        return None
    due = started + timedelta(milliseconds=(took_ms or 0.0) + gap_ms)
    if due <= timezone.now():
        return None
    _queue_pass_at(due, "scheduling-deferred")
    return due


def mark_started() -> None:
    """Called by a pass before it reads, in a statement of its own that commits at once:
    requests committed from now on need a pass of their own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_passrequest SET queued = false, started = started + 1 WHERE id = 1"
        )


def backstops_ensure(*, schedule_model: type[Schedule] = Schedule, using: str = "default") -> int:
    """Create or repair the backstop schedules, one row each however often it runs.

    Returns how many rows it created. ``schedule_model`` is the historical model when called
    from ``post_migrate``."""
    return schedules_ensure(BACKSTOPS, schedule_model=schedule_model, using=using)


def schedules_ensure(
    specs: tuple[tuple[str, str, int], ...],
    *,
    schedule_model: type[Schedule] = Schedule,
    using: str = "default",
) -> int:
    """Make each (name, function, minutes) of ``specs`` exactly one django-q2 Schedule row on
    the scheduler's cluster, repeating forever; duplicates are removed and drifted fields put
    back. Idempotent: the platform calls it after every ``migrate``. Returns the rows created."""
    created = 0
    rows = schedule_model.objects.using(using)
    for name, func, minutes in specs:
        wanted = {
            "func": func,
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
            # Pinned: a node's queue must never carry a pass or a sweep of the estate.
            "cluster": scheduler_cluster(),
        }
        existing = list(rows.filter(name=name).order_by("pk"))
        if not existing:
            rows.create(name=name, **wanted)
            created += 1
            continue
        keep, *extra = existing
        rows.filter(pk__in=[row.pk for row in extra]).delete()
        changed = {key: value for key, value in wanted.items() if getattr(keep, key) != value}
        if changed:
            rows.filter(pk=keep.pk).update(**changed)
    return created
