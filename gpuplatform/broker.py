"""django-q2's ORM broker, woken by PostgreSQL's LISTEN/NOTIFY instead of polling.

django-q2's ORM broker looks at its queue table, and when it finds nothing sleeps ``poll``
seconds and looks again. A launch crosses two queues (the scheduler's, then its node's), so
each poll interval is paid twice in the latency from submit to a running process, and every
idle cluster queries PostgreSQL 1/poll times a second. Measured on 2 cores with 50 ms polls:
from a pass being queued to it beginning, 40-90 ms; from a launch being queued to it beginning,
the same again; five idle clusters, 100 queries a second.

This broker (``Q_CLUSTER["broker_class"]``, the extension point django-q2 provides for it)
keeps the same table and the same claim (a conditional UPDATE of ``lock``), so delivery,
re-delivery after ``retry`` and acknowledgement are django-q2's own. It adds two things:

- ``enqueue`` sends ``NOTIFY`` on the queue's channel in the enqueueing transaction, so the
  notification goes out when the row becomes visible (at commit), never before.
- ``dequeue``, finding nothing ready, waits on a ``LISTEN`` connection until a notification
  comes, or until the earliest row of its queue falls due (a delayed wake-up pass, a task
  handed out again after ``retry``), or ``IDLE_S`` at most (so the pusher sees a stop request
  and a notification lost with a dropped connection costs at most that).

An idle cluster so costs two small queries every ``IDLE_S``, and a queued task starts within
about a millisecond of its commit.
"""

from __future__ import annotations

import logging
import zlib
from datetime import datetime

import psycopg
from django.db import connections
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from psycopg import sql

logger = logging.getLogger(__name__)

# The longest an idle pusher waits before looking at its queue again.
IDLE_S = 1.0
# Never wait less than this for a row that is about to fall due (a busy loop otherwise).
MIN_WAIT_S = 0.002


def channel_for(list_key: str) -> str:
    """The NOTIFY channel of one queue: a short, fixed-form identifier whatever the queue's name
    (node names may hold characters an identifier may not, and identifiers stop at 63 bytes)."""
    return f"djq_{zlib.crc32(list_key.encode()):08x}"


class NotifyingOrm(ORM):
    """django-q2's ORM broker with LISTEN/NOTIFY wake-ups (see the module's docstring)."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key or Conf.CLUSTER_NAME)
        self._listener: psycopg.Connection | None = None

    def enqueue(self, task: str) -> int:
        pk = super().enqueue(task)
        self.notify()
        return pk

    def notify(self) -> None:
        with connections[Conf.ORM].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel_for(self.list_key)])

    def dequeue(self):
        ready = self.get_connection().filter(key=self.list_key, lock__lt=timezone.now())
        tasks = list(ready[: Conf.BULK])
        claimed = [
            (task.pk, task.payload)
            for task in tasks
            if self.get_connection()
            .filter(id=task.id, lock=task.lock)
            .update(lock=self.timeout(task))
        ]
        if claimed:
            return claimed
        if not tasks:  # else another cluster was faster: look again at once
            self.wait(self.next_due())
        return None

    def next_due(self) -> datetime | None:
        """When the earliest row of this queue can be handed out (None: the queue is empty)."""
        return (
            self.get_connection()
            .filter(key=self.list_key)
            .order_by("lock")
            .values_list("lock", flat=True)
            .first()
        )

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
