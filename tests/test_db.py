"""gpuplatform.db: reads sent together in one round trip, in the caller's transaction; kept
connections checked without one."""

from __future__ import annotations

import select
import tempfile

import django.db
import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django_q.signals import pre_execute

from gpuplatform.db import (
    Query,
    close_old_connections,
    compact,
    fetch_together,
    no_flush_wait,
    server_bound_cursor,
)
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def protocol_messages(during, raw=None) -> list[tuple[str, str]]:
    """(direction, message) of each protocol message that crossed the connection (Django's, or
    the psycopg connection ``raw``) while ``during()`` ran, in order: "F" from this process,
    "B" from the server (libpq's trace)."""
    if raw is None:
        connection.ensure_connection()
        raw = connection.connection
    pgconn = raw.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            during()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return [tuple(line.split("\t")[1:4:2]) for line in trace]


def test_each_querys_rows_in_order_in_the_callers_transaction():
    with transaction.atomic():
        Tenant.objects.create(name="uncommitted")
        with CaptureQueriesContext(connection) as logged:
            rows = fetch_together(
                Query("SELECT name FROM tenants_tenant WHERE name = %s", ["uncommitted"]),
                Query("UPDATE tenants_tenant SET name = name WHERE false"),
                Query("SELECT generate_series(1, %(n)s)", {"n": 3}, binary=True),
            )
    assert rows == [[("uncommitted",)], [], [(1,), (2,), (3,)]]
    assert len(logged) == 3  # each statement logged, as Django logs its own


def test_the_queries_travel_in_one_round_trip():
    with transaction.atomic():
        connection.cursor().execute("SELECT 1")  # the transaction has begun
        crossed = protocol_messages(
            lambda: fetch_together(Query("SELECT 1"), Query("SELECT 2"), Query("SELECT 3"))
        )
    answered = [direction for direction, _ in crossed].index("B")
    # Every statement was sent before the server's first answer was read: one wait, not three.
    assert [message for _, message in crossed[:answered]].count("Execute") == 3
    assert [message for _, message in crossed].count("DataRow") == 3


def test_an_error_is_djangos_and_leaves_the_transaction_to_roll_back():
    with pytest.raises(DatabaseError, match="no_such_table"):
        with transaction.atomic():
            fetch_together(Query("SELECT 1"), Query("SELECT * FROM no_such_table"))
    assert fetch_together(Query("SELECT 1")) == [[(1,)]]


def test_statements_are_logged_as_written_also_once_psycopg_prepared_them():
    # psycopg prepares a statement from its 5th run on (settings._PREPARED) and then keeps no
    # text of it: Django's own wrapper logged None from there on.
    for _ in range(7):
        with CaptureQueriesContext(connection) as logged:
            fetch_together(Query("SELECT %s::int", [1]), Query("SELECT 2"))
            with server_bound_cursor() as cursor:
                cursor.execute("SELECT %s::int + 1", [1])
        assert [query["sql"] for query in logged] == [
            "SELECT %s::int",
            "SELECT 2",
            "SELECT %s::int + 1",
        ]


def select_2() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 2")


def sent(during) -> list[str]:
    return [message for direction, message in protocol_messages(during) if direction == "F"]


@pytest.mark.django_db(transaction=True)
def test_a_kept_connection_is_checked_without_a_round_trip():
    select_2()
    alone = sent(select_2)

    def next_round() -> None:
        close_old_connections()
        select_2()

    assert sent(next_round) == alone  # Django's own check sends a SELECT 1 first
    assert connection.health_check_done


def terminated(pid: int, raw) -> bool:
    """End the session ``pid`` from another connection; whether ``raw`` (its psycopg
    connection) then got the server's goodbye within 10 s."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    readable, _, _ = select.select([raw.fileno()], [], [], 10)
    return bool(readable)


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_ended_is_replaced_before_its_next_use():
    connection.ensure_connection()
    ended = connection.connection.info.backend_pid
    assert terminated(ended, connection.connection)  # the server's goodbye

    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != ended


@pytest.mark.django_db(transaction=True)
def test_a_django_q_worker_checks_its_connection_before_each_job():
    select_2()
    django.db.close_old_connections()  # what a django-q2 worker does before each job
    pre_execute.send(sender="django_q", func=select_2, task={})
    assert connection.health_check_done


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_no_flush_wait_is_for_its_statements_own_transaction_alone():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {no_flush_wait()}, current_setting('synchronous_commit')")
        assert cursor.fetchone()[1] == "off"
    assert synchronous_commit() == "on"  # the session's, and so the next statement's

    with transaction.atomic():  # a caller's transaction keeps waiting for the disk
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {no_flush_wait()}")
        assert synchronous_commit() == "on"


def test_compact_drops_comments_and_spaces_and_keeps_literals():
    sql = """
        SELECT 'a  -- b', "odd  name", x -- the reason
          FROM t   -- it's here
         WHERE y = 'it''s  so'
    """
    assert compact(sql) == """SELECT 'a  -- b', "odd  name", x FROM t WHERE y = 'it''s  so'"""
    with connection.cursor() as cursor:
        cursor.execute(compact("SELECT 'a  -- b' -- gone\n , 2"))
        assert cursor.fetchone() == ("a  -- b", 2)


def test_the_hand_offs_statements_are_short_enough_for_psycopgs_cache():
    """Longer, psycopg parsed their placeholders again on every execution."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    from nodeagent.launcher import lifecycle
    from scheduling import scheduler
    from scheduling.agentapi import handoff, reports

    for sql in (handoff._CANDIDATES, handoff._SUCCEEDED, handoff._TAKEN, reports._STARTED,
                scheduler._PLACE, lifecycle._LAUNCH):  # fmt: skip
        assert len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH
