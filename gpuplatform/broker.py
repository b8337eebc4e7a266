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
  after ``retry``), or ``idle_s`` at most (``IDLE_S`` unless the broker is made with another:
  django-q2's pusher sees a stop request no later than that). After a claim that left no row
  ready it waits the same way before it claims again. The wait sleeps in one ``select`` on the
  listener's socket: a notification, the session's end (a restarted server) or a dead peer
  (TCP keepalives, ``DB_PEER_TIMEOUT``) wakes it, as does ``interrupt()`` from another thread
  (a stop request). A listener is opened before the claim it follows, so a notification sent
  between the claim and the wait is never missed; after a lost listener the next claim comes
  once a new one listens.
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

import contextlib
import logging
import os
import selectors
import threading
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
from gpuplatform.outage import OutageLog

logger = logging.getLogger(__name__)

# The longest an idle pusher waits before looking at its queue again (by default: a broker made
# with ``idle_s`` waits that long instead).
IDLE_S = 1.0
# After a failure to listen, how long a dequeue waits before it claims (and tries) again.
RELISTEN_S = 1.0
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


# A sole consumer's claims that an outage left (jobs it is not running), ready again now.
_RELEASE = """
    WITH released AS (UPDATE django_q_ormq SET lock = %(now)s
                       WHERE key = %(key)s AND lock > %(now)s AND id <> ALL(%(running)s::bigint[])
                      RETURNING 1)
    SELECT count(*) FROM released
"""


# QueueBatch's: the rows of any number of queues, and a notification on each queue's channel.
_INSERT_MANY = """
    WITH queued AS (INSERT INTO django_q_ormq (key, payload, lock)
                    SELECT v.key, v.payload, %s
                      FROM unnest(%s::text[], %s::text[]) AS v(key, payload))
    SELECT pg_notify(channel, '') FROM unnest(%s::text[]) AS channel
"""


def queue_broker(list_key: str, *, idle_s: float | None = None) -> Broker:
    """The broker a process takes one queue's jobs with: this module's, waiting ``idle_s`` at
    most between claims when nothing wakes it; django-q2's own ORM broker, which polls, with
    ``GPUPLATFORM_STOCK=broker`` (nothing would wake a wait then: its enqueues notify no one)."""
    if not Conf.BROKER_CLASS:
        return get_broker(list_key)
    return NotifyingOrm(list_key=list_key, idle_s=idle_s)


def interrupt(broker: Broker) -> None:
    """End a wait of ``broker`` under way (a stop), if it is one that waits."""
    if isinstance(broker, NotifyingOrm):
        broker.interrupt()


def close_listener(broker: Broker) -> None:
    if isinstance(broker, NotifyingOrm):
        broker.close_listener()


def channel_for(list_key: str) -> str:
    """The NOTIFY channel of one queue: a short, fixed-form identifier whatever the queue's name
    (node names may hold characters an identifier may not, and identifiers stop at 63 bytes)."""
    return f"djq_{zlib.crc32(list_key.encode()):08x}"


class NotifyingOrm(ORM):
    """django-q2's ORM broker with LISTEN/NOTIFY wake-ups (see the module's docstring)."""

    def __init__(self, list_key: str | None = None, *, idle_s: float | None = None) -> None:
        super().__init__(list_key=list_key or Conf.CLUSTER_NAME)
        self.idle_s = idle_s  # None: IDLE_S
        self._listener: psycopg.Connection | None = None
        self._listen_outage = OutageLog(logger)  # tries to open the listener that failed
        # ``interrupt``: set, and a byte in the pipe a waiting select watches (made with the
        # first wait; the lock keeps a write off a pipe being closed).
        self._interrupted = threading.Event()
        self._wake: tuple[int, int] | None = None
        self._wake_lock = threading.Lock()
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
        self._listen()  # before the claim: what is queued after it wakes the wait below
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

    def release_claims(self, running: list) -> int:
        """Make the queue's claimed rows but ``running`` (ids) ready again; how many. Only for
        a queue this process alone takes, after an outage (``JobRunner``'s ``sole_consumer``):
        another consumer's claim would be run twice, a delayed row early."""
        params = {"now": timezone.now(), "key": self.list_key, "running": running}
        released = self._one(_RELEASE, params)[0]
        if released:
            self._wait_first = False  # the next dequeue claims them, without waiting for a wake-up
        return released

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
        """Until a notification, ``due``, ``idle_s`` or ``interrupt()``, whichever comes first;
        at once if no listener listens (the next claim comes after a new one does)."""
        timeout = IDLE_S if self.idle_s is None else self.idle_s
        if due is not None:
            timeout = min(timeout, max(MIN_WAIT_S, (due - timezone.now()).total_seconds()))
        listener = self._listen()
        if listener is None:
            self._sleep(min(timeout, RELISTEN_S))
            return
        try:
            if self._sleep(timeout, listener.fileno()):
                # Read what came (notifications, or the end of the session, which raises).
                for _ in listener.notifies(timeout=0):
                    pass
        except psycopg.Error as exc:
            # The pusher looks again after this, once a new listener listens.
            logger.warning("queue listener for %s lost (%s); reconnecting", self.list_key, exc)
            self.close_listener()

    def interrupt(self) -> None:
        """End the wait under way, and every later one, at once (from any thread): a stop."""
        self._interrupted.set()
        with self._wake_lock:
            if self._wake is not None:
                with contextlib.suppress(BlockingIOError):  # full: it is woken already
                    os.write(self._wake[1], b"x")

    def _sleep(self, timeout: float, fileno: int | None = None) -> bool:
        """Sleep ``timeout`` at most, woken by ``interrupt()`` or by ``fileno`` turning readable
        (True: it did)."""
        with self._wake_lock:
            if self._wake is None:
                self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            wake = self._wake[0]
        if self._interrupted.is_set():  # after the pipe exists: a later interrupt writes there
            return False
        with selectors.DefaultSelector() as selector:
            selector.register(wake, selectors.EVENT_READ)
            if fileno is not None:
                selector.register(fileno, selectors.EVENT_READ)
            ready = {key.fd for key, _ in selector.select(timeout)}
        return fileno in ready

    def _listen(self) -> psycopg.Connection | None:
        """The listener, opened if there is none; None if it cannot be (a warning the first
        time in a row, debug after it)."""
        try:
            listener = self.listener()
        except psycopg.Error as exc:
            self._listen_outage.failed("cannot listen to queue %s (%s); trying again",
                                       self.list_key, exc)  # fmt: skip
            self.close_listener()
            return None
        self._listen_outage.reached("listening to queue %s again (after %.0f s)", self.list_key)
        return listener

    def listener(self) -> psycopg.Connection:
        if self._listener is None or self._listener.closed:
            params = connections[Conf.ORM].get_connection_params()
            # The connection's own parameters carry libpq's keepalives and tcp_user_timeout
            # (settings, DB_PEER_TIMEOUT): a server that vanished shows as an error here.
            listener = psycopg.connect(**params, autocommit=True)
            listener.execute(
                sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(self.list_key)))
            )
            self._listener = listener
        return self._listener

    def close_listener(self) -> None:
        with self._wake_lock:
            if self._wake is not None:
                for fd in self._wake:
                    os.close(fd)
                self._wake = None
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
