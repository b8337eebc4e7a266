"""Database access Django's cursors do not offer."""

from __future__ import annotations

import re
import select
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import close_old_connections as django_close_old_connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg.pq import ConnStatus, TransactionStatus


@contextmanager
def server_bound_cursor(*, binary_results: bool = False, using: str = DEFAULT_DB_ALIAS) -> Iterator:
    """A cursor on Django's connection (so in its transaction) that binds parameters on the
    server, in binary: Django's client-side binding quotes a large array in Python, where
    psycopg's C dumpers send it as it is. ``binary_results`` also has the rows come back in
    binary (arrays of numbers arrive as machine words, not text to parse). Wrapped as ``_wrap``
    says."""
    connection = connections[using]
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as raw:
        if binary_results:
            raw.format = psycopg.pq.Format.BINARY
        yield _wrap(connection, raw)


class _LoggedAsWritten(CursorDebugWrapper):
    """Logs each statement as written: Django's own wrapper logs what psycopg says it sent,
    and once psycopg has prepared a statement (settings._PREPARED) it keeps no text of it, so
    the log said None."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


def _wrap(connection, raw: psycopg.Cursor) -> CursorWrapper:
    """``raw`` wrapped as Django wraps its own cursors, so query logging, counting and execute
    wrappers still see every statement."""
    if connection.queries_logged:
        return _LoggedAsWritten(raw, connection)
    return connection.make_cursor(raw)


# A literal (kept as it is), or a run of comments and white space (one space).
_SQL_FILLER = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|(?:--[^\n]*|\s+)+""")


def compact(sql: str) -> str:
    """``sql`` without its comments and with one space for each run of white space, for a
    statement written at length that runs often: psycopg parses a statement's placeholders once
    and caches the result only for statements of at most 4,096 bytes
    (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``): it parsed a longer one again on every
    execution (the hand-off's ``_CANDIDATES``, about 1% of a node agent's relay thread)."""
    return _SQL_FILLER.sub(lambda found: found.group(1) or " ", sql).strip()


@dataclass(frozen=True)
class Query:
    """A read for ``fetch_together``: its SQL, its parameters and whether its rows come back in
    binary (``server_bound_cursor``'s ``binary_results``)."""

    sql: str
    params: Sequence[Any] | Mapping[str, Any] | None = None
    binary: bool = False


def fetch_together(*queries: Query, using: str = DEFAULT_DB_ALIAS) -> list[list[tuple]]:
    """Each query's rows ([] for a statement that returns none), the queries sent to the server
    in one round trip (psycopg's pipeline mode) rather than one after another. The server runs
    them in order, in the connection's transaction, so a query that waits for a lock holds
    back the ones after it, as it would sent alone. Bound and logged as
    ``server_bound_cursor``'s statements are.

    Why: on a busy machine each round trip also waits for the server's process to be scheduled
    and then this one, which can cost a scheduling pass reading its snapshot in ten statements
    far more time than its own CPU."""
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    with ExitStack() as cursors:
        sent = []
        with connection.wrap_database_errors, raw.pipeline():
            for query in queries:
                cursor = cursors.enter_context(psycopg.Cursor(raw))
                if query.binary:
                    cursor.format = psycopg.pq.Format.BINARY
                wrapped = _wrap(connection, cursor)
                wrapped.execute(query.sql, query.params)
                sent.append(wrapped)
        return [wrapped.fetchall() if wrapped.description else [] for wrapped in sent]


def no_flush_wait(using: str = DEFAULT_DB_ALIAS) -> str:
    """An expression for a statement's select list that has the statement's commit not wait
    for its WAL to reach the disk (``synchronous_commit`` off for that transaction alone), when
    it runs in no transaction of its caller's; inside one it is a plain NULL, for it would
    relax the caller's whole transaction.

    For writes whose loss costs nothing: a broker's claim and acknowledgement (a job claimed or
    acknowledged again: django-q2 delivers at least once), a rate limit's step. Only a crash of
    PostgreSQL itself (not of the platform) can lose such a commit, one made in its last
    moments (a few times ``wal_writer_delay``), and never one that a later synchronous commit
    followed: the WAL is flushed in order. The database stays consistent either way. Each
    task's launch job is claimed and acknowledged once: two flushes of the WAL that every other
    commit would wait behind on a busy machine (LWLock ``WALWrite`` and ``WALSync`` waits)."""
    if connections[using].in_atomic_block:
        return "NULL"
    return "set_config('synchronous_commit', 'off', true)"


def close_old_connections() -> None:
    """Django's ``close_old_connections``, then ``check_kept_connections``: for the loops
    outside a request that call it before each round of work (a node agent's, its sampler's)."""
    django_close_old_connections()
    check_kept_connections()


def check_kept_connections(**_signal) -> None:
    """The health check (``CONN_HEALTH_CHECKS``) of each connection kept open, done without the
    round trip of Django's ``SELECT 1`` where it can be.

    After ``close_old_connections`` Django checks a kept connection with a ``SELECT 1`` on its
    first use: a round trip more for much of the per-task work (a launch job's, a pass's, an
    agent's round). A connection whose session is quiet (``quiet``: its
    socket has nothing to read) is marked checked, and any other (something came: a
    notification or the end) is left to Django's own check, which replaces it if it is gone.
    Connected to django-q2's ``pre_execute``, which its workers send after closing old
    connections, before each job."""
    for wrapper in connections.all(initialized_only=True):
        raw = wrapper.connection
        if raw is None or wrapper.health_check_done or not wrapper.health_check_enabled:
            continue
        if quiet(raw.pgconn):
            wrapper.health_check_done = True


def quiet(pgconn) -> bool:
    """An idle session in good order whose socket has nothing to read (one ``poll``, no wait).

    An idle session is sent nothing unasked but a notification, or its end: a server that ends
    it (a restart, a terminated backend) sends why, then closes the socket. So a quiet socket
    is a live session; anything else (something came) needs a look by the server, which
    replaces a session that is gone. A server that goes away after this and before the first
    statement fails that statement, as it could after a round trip's check."""
    if pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
        return False
    waiting = select.poll()
    waiting.register(pgconn.socket, select.POLLIN)
    return not waiting.poll(0)
