"""A publisher sends live events only to groups that have members, and hears of a new member
before its next commit returns (live.events: ``_Listeners``, live migration 0001's trigger).

Real PostgreSQL and channels_postgres' tables: the join is the row channels_postgres'
``group_add`` inserts, made on a connection of its own as daphne's would be."""

from __future__ import annotations

import select

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from live import events
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

OPS_KEY = "asgi:group:" + events.OPS


@pytest.fixture
def postgres_layer(settings):
    settings.CHANNEL_LAYER = "postgres"
    config = {**settings.DATABASES["default"], "TIME_ZONE": None}
    with override_settings(
        CHANNEL_LAYERS={
            "default": {"BACKEND": "channels_postgres.core.PostgresChannelLayer", "CONFIG": config}
        }
    ):
        connection.close()  # a connection of its own: it knows nothing of the groups yet
        yield
        connection.close()


@pytest.fixture
def daphne_connection(postgres_layer):
    """Another session, as a web process's channel layer holds."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as other:
        yield other


def join(other, group_key: str, channel: str) -> None:
    other.execute(
        "INSERT INTO channels_postgres_groupchannel (group_key, channel, expire) "
        "VALUES (%s, %s, now() + interval '1 day')",
        [group_key, channel],
    )


def delivered(other, channel: str) -> int:
    return other.execute(
        "SELECT count(*) FROM channels_postgres_message WHERE channel = %s", [channel]
    ).fetchone()[0]


def scheduler_event() -> dict[str, list[dict]]:
    return {events.OPS: [{"kind": "scheduler", "placed": 1}]}


def test_groups_nobody_joined_cost_one_statement_then_none(postgres_layer):
    with CaptureQueriesContext(connection) as first:
        events.send(scheduler_event())
    with CaptureQueriesContext(connection) as later:
        for _ in range(3):
            events.send(scheduler_event())
    assert [q["sql"].split()[0] for q in first.captured_queries] == ["LISTEN", "WITH"]
    assert later.captured_queries == []


def test_a_join_is_heard_by_the_next_commit_of_a_publisher_that_saw_nobody(daphne_connection):
    events.send(scheduler_event())  # learns that nobody listens
    join(daphne_connection, OPS_KEY, "specific.daphne!one")
    # A change committed after the join: its event is sent on commit, as every publisher's is.
    with transaction.atomic():
        task = TaskFactory(name="after-the-join")
        events.publish_tasks([task])
    assert delivered(daphne_connection, "specific.daphne!one") == 1


def test_a_join_while_the_publisher_was_idle_counts_for_its_next_send(daphne_connection):
    events.send(scheduler_event())
    join(daphne_connection, OPS_KEY, "specific.daphne!two")
    # Wait (a wait, not a timed assertion) until the notification is in the socket: the send
    # must read it from there, with no statement of its own to bring it.
    readable, _, _ = select.select([connection.connection.pgconn.socket], [], [], 30)
    assert readable
    events.send(scheduler_event())
    assert delivered(daphne_connection, "specific.daphne!two") == 1


def test_only_groups_with_members_get_messages(daphne_connection):
    join(daphne_connection, "asgi:group:" + events.tenant_group(7), "specific.daphne!three")
    events.send(scheduler_event())  # learns: tenant 7's group only
    with CaptureQueriesContext(connection) as ops_only:
        events.send(scheduler_event())
    events.send({events.OPS: [{"kind": "x"}], events.tenant_group(7): [{"kind": "y"}]})
    assert ops_only.captured_queries == []
    assert delivered(daphne_connection, "specific.daphne!three") == 1


def test_a_send_inside_a_transaction_always_inserts(postgres_layer):
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        events.send(scheduler_event())
        events.send(scheduler_event())
    assert [q["sql"].split()[0] for q in inside.captured_queries] == ["WITH", "WITH"]
