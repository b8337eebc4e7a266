"""A burst of submissions into young tables is analysed after the next pass, not up to a minute
later by autovacuum (``scheduling.planner_stats``)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduling import planner_stats, scheduler
from scheduling.spec import TaskSpec
from scheduling.submission import tasks_submit


def stats(table: str) -> tuple[int, float]:
    """(rows changed since the last ANALYZE, as the statistics count them; rows the planner
    believes the table holds)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # this session's counts, now
        cursor.execute(
            "SELECT s.n_mod_since_analyze, c.reltuples FROM pg_stat_user_tables s"
            " JOIN pg_class c ON c.oid = s.relid WHERE s.relname = %s",
            [table],
        )
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_submissions_is_analysed_at_the_next_look(lab, workstation, monkeypatch):
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_task")  # as autovacuum leaves it: none pending
    keep_up = planner_stats.keep_up
    monkeypatch.setattr(planner_stats, "keep_up", list)  # the submission's own pass: no look
    tasks_submit(
        tenant=lab, specs=[TaskSpec(name=f"burst-{i}", command="true") for i in range(600)]
    )
    deadline = time.monotonic() + 10
    while stats("scheduling_task")[0] < 600 and time.monotonic() < deadline:
        time.sleep(0.1)  # the statistics' counters arrive from the backend within a second
    monkeypatch.setattr(planner_stats, "_looked", -planner_stats.EVERY_S)
    assert "scheduling_task" in keep_up()
    assert stats("scheduling_task")[1] >= 600  # what the planner now knows of the table
    # Looked at most once every EVERY_S: whatever changed since waits for the next look.
    assert keep_up() == []


def test_each_pass_looks_once(lab, workstation, monkeypatch):
    looks = []
    monkeypatch.setattr(planner_stats, "keep_up", lambda: looks.append(1))
    scheduler.schedule_pass()
    assert looks == [1]


def test_a_table_that_changed_by_less_than_half_is_left_to_autovacuum(db, monkeypatch):
    monkeypatch.setattr(planner_stats, "_looked", -planner_stats.EVERY_S)
    monkeypatch.setattr(planner_stats, "MIN_CHANGED", 10**9)
    assert planner_stats.keep_up() == []


def test_an_analyse_skips_the_columns_no_query_filters(lab, workstation):
    tasks_submit(tenant=lab, specs=[TaskSpec(name=f"t-{i}", command="true") for i in range(20)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_task")
        cursor.execute(
            "SELECT attname FROM pg_stats WHERE schemaname = current_schema()"
            " AND tablename = 'scheduling_task'"
        )
        analysed = {name for (name,) in cursor.fetchall()}
    assert analysed.isdisjoint(planner_stats.UNFILTERED["scheduling_task"])
    assert {"state", "tenant_id", "queue", "priority", "submitted_at"} <= analysed
