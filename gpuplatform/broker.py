"""django-q2's ORM broker, woken by PostgreSQL's LISTEN/NOTIFY instead of polling.

django-q2's ORM broker looks at its queue table and, finding nothing, sleeps ``poll`` seconds
before it looks again. A launch crosses two queues (the scheduler's, then its node's), so it
waits for a poll twice on its way from submit to a running process, and every idle cluster
keeps querying PostgreSQL.

This broker (``Q_CLUSTER["broker_class"]``, django-q2's extension point for it) keeps the same
table and the same claim (a conditional UPDATE of ``lock``), so delivery, re-delivery after
``retry`` and acknowledgement are django-q2's own. It adds:

- ``enqueue`` sends ``NOTIFY`` on the queue's channel in the enqueueing transaction, so the
  notification goes out when the row becomes visible (at commit), never before.
- ``dequeue``, finding nothing ready, waits on a ``LISTEN`` connection until a notification
  comes, or the earliest row of its queue falls due (a delayed pass, a job handed out again
  after ``retry``), or ``IDLE_S`` at most (so the pusher sees a stop request, and a
  notification lost with a dropped connection costs no more than that). After a claim that
  left no row ready it waits the same way before it claims again.
- Each operation is one statement on the process's own connection, bound on the server (so
  prepared after a few runs): an enqueue inserts and notifies, a dequeue claims the ready rows
  oldest first with one ``UPDATE ... FOR UPDATE SKIP LOCKED`` that also says when the next row
  falls due, an acknowledgement is one ``DELETE``. Claims and acknowledgements do not wait for
  the WAL to reach the disk (``gpuplatform.db.no_flush_wait``: one lost in a crash of
  PostgreSQL hands a job out again, which django-q2's at-least-once delivery allows). There is
  no ``close_old_connections()`` (and so no health check) before each statement, as
  django-q2's broker has: a statement outside a transaction that fails on a dropped session is
  tried once more on a new one.

``GPUPLATFORM_STOCK=broker`` runs django-q2's own ORM broker instead.
"""

from __future__ import annotations

import logging
import time
import zlib
from datetime import datetime, timedelta

import psycopg
from django.db import DatabaseError, connections
from django.utils import timezone
from django_q.brokers import Broker, get_broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from psycopg import sql

from gpuplatform.db import no_flush_wait, server_bound_cursor

logger = logging.getLogger(__name__)

# The longest an idle pusher waits before looking at its queue again.
IDLE_S = 1.0
# Never wait less than this for a row that is about to fall due (a busy loop otherwise).
MIN_WAIT_S = 0.002
# How often a cluster's statistics (what `qmonitor` and `qinfo` show) reach the cache, at most.
# django-q2 saves them every guard cycle (0.5 s) with a 3 s expiry; with the database cache
# each save is three statements, most of an idle estate's load on PostgreSQL. They are kept
# three times as long as this.
STAT_EVERY_S = 5.0


# The queue's table is django-q2's own (django_q.models.OrmQ); ids are handed out oldest first.
_INSERT = """
    WITH row AS (INSERT INTO django_q_ormq (key, payload, lock) VALUES (%s, %s, %s) RETURNING id)
    SELECT id, pg_notify(%s, '') FROM row
"""
# Claims the ready rows, and says when the earliest of the others falls due (NULL: none is
# left), which a pusher about to wait needs: one round trip, not two (the row without an id).
# The row without an id also carries ``no_flush_wait`` (evaluated once: an aggregate's row).
_CLAIM = """
    WITH claimed AS (
        UPDATE django_q_ormq SET lock = %(until)s
         WHERE id IN (SELECT id FROM django_q_ormq WHERE key = %(key)s AND lock < %(now)s
                       ORDER BY id LIMIT %(bulk)s FOR UPDATE SKIP LOCKED)
        RETURNING id, payload)
    SELECT id, payload, NULL::timestamptz FROM claimed
     UNION ALL
    SELECT NULL, {no_flush_wait}, min(lock) FROM django_q_ormq
     WHERE key = %(key)s AND id NOT IN (SELECT id FROM claimed)
"""
_ACKNOWLEDGE = """
    WITH acknowledged AS (DELETE FROM django_q_ormq WHERE id = %s) SELECT {no_flush_wait}
"""


# QueueBatch's: the rows of any number of queues, and a notification on each queue's channel.
_INSERT_MANY = """
    WITH queued AS (INSERT INTO django_q_ormq (key, payload, lock)
                    SELECT v.key, v.payload, %s
                      FROM unnest(%s::text[], %s::text[]) AS v(key, payload))
    SELECT pg_notify(channel, '') FROM unnest(%s::text[]) AS channel
"""


def channel_for(list_key: str) -> str:
    """The NOTIFY channel of one queue: a short, fixed-form identifier whatever the queue's name
    (node names may hold characters an identifier may not, and identifiers stop at 63 bytes)."""
    return f"djq_{zlib.crc32(list_key.encode()):08x}"


class NotifyingOrm(ORM):
    """django-q2's ORM broker with LISTEN/NOTIFY wake-ups (see the module's docstring)."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key or Conf.CLUSTER_NAME)
        self._listener: psycopg.Connection | None = None
        self._stat_saved: dict[str, float] = {}
        # After a claim that left no row ready: wait before the next one, until this time.
        self._wait_first = False
        self._due: datetime | None = None

    def enqueue(self, task: str) -> int:
        return self.insert(task, timezone.now())

    def insert(self, task: str, lock: datetime) -> int:
        """Queue ``task`` to be handed out from ``lock`` on, and notify the queue's listeners
        (at commit: the statement runs in the caller's transaction, if any)."""
        return self._one(_INSERT, [self.list_key, task, lock, channel_for(self.list_key)])[0]

    def dequeue(self):
        if self._wait_first:
            # The last claim left no row ready: a new one comes with a notification (one that
            # came meanwhile ends the wait at once), or falls due. Claiming again straight away
            # found nothing nearly every time: one empty claim per job handed out.
            self._wait_first = False
            self.wait(self._due)
        now = timezone.now()
        rows = self._execute(
            _CLAIM.format(no_flush_wait=no_flush_wait(Conf.ORM)),
            {
                "until": now + timedelta(seconds=Conf.RETRY),
                "key": self.list_key,
                "now": now,
                "bulk": Conf.BULK,
            },
        )
        claimed = [(pk, payload) for pk, payload, _ in rows if pk is not None]
        due = next((when for pk, _, when in rows if pk is None), None)
        if claimed:
            # Only when none of the rows left is ready: the claim took at most ``bulk``.
            self._wait_first, self._due = due is None or due > now, due
            return sorted(claimed)  # RETURNING keeps no order
        self.wait(due)
        return None

    def delete(self, task_id) -> None:  # django-q2's acknowledge and fail call this
        self._execute(_ACKNOWLEDGE.format(no_flush_wait=no_flush_wait(Conf.ORM)), [task_id])

    def set_stat(self, key: str, value: str, timeout: int) -> None:
        """Save a cluster's statistics every STAT_EVERY_S at most (see there)."""
        now = time.monotonic()
        if now < self._stat_saved.get(key, -STAT_EVERY_S) + STAT_EVERY_S:
            return
        self._stat_saved[key] = now
        super().set_stat(key, value, max(timeout, int(3 * STAT_EVERY_S)))

    def _one(self, statement: str, params: list) -> tuple:
        return self._execute(statement, params)[0]

    def _execute(self, statement: str, params: list | dict) -> list:
        connection = connections[Conf.ORM]
        for attempt in (1, 2):
            try:
                # Bound on the server, so prepared after a few runs (settings._PREPARED): each
                # job costs a claim and an acknowledgement.
                with server_bound_cursor(using=Conf.ORM) as cursor:
                    cursor.execute(statement, params)
                    return cursor.fetchall() if cursor.description else []
            except DatabaseError:
                if connection.in_atomic_block or attempt == 2:
                    raise  # the caller's transaction is the caller's to handle
                # A session the server dropped (a restart): once more, on a new one.
                connection.close()
        raise AssertionError("unreachable")

    def wait(self, due: datetime | None) -> None:
        timeout = IDLE_S
        if due is not None:
            timeout = min(IDLE_S, max(MIN_WAIT_S, (due - timezone.now()).total_seconds()))
        try:
            listener = self.listener()
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.Error as exc:
            # The pusher looks again after this; a new listener is opened then.
            logger.warning("queue listener for %s lost (%s); reconnecting", self.list_key, exc)
            self.close_listener()

    def listener(self) -> psycopg.Connection:
        if self._listener is None or self._listener.closed:
            params = connections[Conf.ORM].get_connection_params()
            listener = psycopg.connect(**params, autocommit=True)
            listener.execute(
                sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(self.list_key)))
            )
            self._listener = listener
        return self._listener

    def close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            finally:
                self._listener = None


class QueueBatch:
    """Jobs for any number of queues, queued in one statement (each queue notified in it): pass
    ``broker(queue)`` to ``async_task`` as the broker of each job, then call ``send()``, in the
    transaction the jobs belong to. A pass queues one launch job on each node it placed tasks
    on: one round trip for all of them, not one each. With django-q2's own broker
    (``GPUPLATFORM_STOCK=broker``) each job is queued at once, by that broker."""

    def __init__(self) -> None:
        self._jobs: list[tuple[str, str]] = []  # (queue, django-q2's signed package)

    def broker(self, list_key: str) -> _Collector | Broker:
        if not Conf.BROKER_CLASS:  # django-q2's own broker (GPUPLATFORM_STOCK=broker)
            return get_broker(list_key)  # queues each job at once, in the same transaction
        return _Collector(self._jobs, list_key)

    def send(self) -> None:
        if not self._jobs:
            return
        keys = [key for key, _ in self._jobs]
        channels = sorted({channel_for(key) for key in keys})
        with server_bound_cursor(using=Conf.ORM) as cursor:
            cursor.execute(
                _INSERT_MANY, [timezone.now(), keys, [job for _, job in self._jobs], channels]
            )
        self._jobs.clear()


class _Collector:
    """What ``async_task`` needs of a broker to queue a job (``list_key``, ``enqueue``), the
    job kept for its QueueBatch."""

    def __init__(self, jobs: list[tuple[str, str]], list_key: str) -> None:
        self._jobs = jobs
        self.list_key = list_key

    def enqueue(self, task: str) -> None:
        self._jobs.append((self.list_key, task))
