"""Requests for a scheduling pass: coalesced, and always queued for the scheduler's cluster."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling import passes, scheduler, snapshot
from scheduling.models import PassRequest
from tests.nodeagent.launcher.conftest import wait_for


@pytest.fixture
def queued(monkeypatch):
    calls = []
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: calls.append(kwargs))
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_pass_is_queued_for_the_scheduler_even_from_a_nodes_process(queued, monkeypatch):
    # A process of a node's with the name of the node's queue in its environment.
    monkeypatch.setenv("Q_CLUSTER_NAME", "workstation-1")
    passes.request_pass()
    assert [call["cluster"] for call in queued] == ["gpuplatform"]


@pytest.mark.django_db(transaction=True)
def test_requests_before_the_pass_starts_queue_one_pass(queued):
    for _ in range(5):
        passes.request_pass()
    assert len(queued) == 1
    passes.mark_started()
    passes.request_pass()
    assert len(queued) == 2
    assert PassRequest.objects.get(pk=1).queued


@pytest.mark.django_db(transaction=True)
def test_a_request_costs_one_statement_queued_or_not(queued):
    with CaptureQueriesContext(connection) as first:
        passes.request_pass()  # the row is made here, the first time
    with CaptureQueriesContext(connection) as idle:
        passes.mark_started()
        passes.request_pass()
    with CaptureQueriesContext(connection) as busy:
        passes.request_pass()
    assert len(queued) == 2
    assert len(first.captured_queries) > 1
    assert len(idle.captured_queries) == 2  # mark_started's, then the request's
    assert len(busy.captured_queries) == 1
    assert PassRequest.objects.get(pk=1).queued


def in_thread(func) -> threading.Thread:
    """``func`` in a thread of its own, with a database connection of its own."""

    def run():
        try:
            func()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture
def paused_pass(monkeypatch):
    """Start a pass in a thread that stops once it has read its snapshot; yields what lets it
    (and any pass after it) go on, which the fixture also does at the end."""
    scheduler.schedule_pass()  # keeps the fair-share counters: the passes below lock no rows
    passes.request_pass()  # the pass about to start clears what this set
    read, release = threading.Event(), threading.Event()
    build_snapshot = snapshot.build_snapshot

    def snapshot_then_wait(*args, **kwargs):
        taken = build_snapshot(*args, **kwargs)
        read.set()
        release.wait(timeout=30)
        return taken

    monkeypatch.setattr(scheduler, "build_snapshot", snapshot_then_wait)
    running = in_thread(scheduler.schedule_pass)
    try:
        assert read.wait(timeout=30)
        yield release.set
    finally:
        release.set()
        running.join(timeout=30)


def waiting_for_a_lock() -> bool:
    """Whether a session waits for an advisory lock (the second pass, for the first's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] > 0


def passes_queued(queued) -> int:
    return sum(call["task_name"] == "scheduling-pass" for call in queued)


@pytest.mark.django_db(transaction=True)
def test_a_request_after_a_running_pass_read_its_snapshot_queues_another(queued, paused_pass):
    # A task committed now is not in the running pass's snapshot: the request must queue a pass.
    passes.request_pass()
    assert passes_queued(queued) == 2


@pytest.mark.django_db(transaction=True)
def test_a_pass_waiting_for_the_lock_takes_the_requests_made_meanwhile(queued, paused_pass):
    passes.request_pass()  # queues the next pass
    waiting = in_thread(scheduler.schedule_pass)  # the next pass, waiting for the lock
    try:
        wait_for(waiting_for_a_lock)
        passes.request_pass()  # the waiting pass will see this: nothing more to queue
        assert passes_queued(queued) == 2
    finally:
        paused_pass()  # both passes go on
        waiting.join(timeout=60)


@pytest.mark.django_db
def test_the_backstop_schedules_run_only_on_the_scheduler_s_cluster():
    from django_q.models import Schedule

    passes.backstops_ensure()
    assert set(Schedule.objects.values_list("cluster", flat=True)) == {"gpuplatform"}


@pytest.mark.django_db(transaction=True)
def test_a_plain_submission_claims_the_flag_in_its_own_insert(queued, lab, workstation):
    """Committing by itself, the INSERT also claims the flag: no request statement after it.
    In a transaction (dependency links here) the request still follows the commit."""
    from scheduling.spec import TaskSpec
    from scheduling.submission import task_submit, tasks_submit

    def submit(specs) -> list[str]:
        with CaptureQueriesContext(connection) as statements:
            tasks_submit(tenant=lab, specs=specs)
        return [query["sql"] for query in statements.captured_queries]

    first = submit([TaskSpec(name="new-db", command="true")])  # the flag's row is made here
    assert len(queued) == 1 and PassRequest.objects.get(pk=1).queued

    busy = submit([TaskSpec(name="busy", command="true")])
    assert len(queued) == 1  # a pass is queued already
    assert [sql for sql in busy if "scheduling_passrequest" in sql] == [
        sql for sql in busy if "INSERT INTO" in sql
    ]

    passes.mark_started()
    idle = submit([TaskSpec(name="idle", command="true")])
    assert len(queued) == 2 and PassRequest.objects.get(pk=1).queued
    assert sum("scheduling_passrequest" in sql for sql in idle) == 1

    task_submit(tenant=lab, spec=TaskSpec(name="prep", command="true"))  # a pass is queued
    passes.mark_started()
    linked = submit([TaskSpec(name="after", command="true", after=["prep"])])
    assert len(queued) == 3
    request = next(i for i, sql in enumerate(linked) if "scheduling_passrequest" in sql)
    assert "INSERT INTO" not in linked[request] and request > 0
    assert any("INSERT INTO" in sql and "scheduling_passrequest" in sql for sql in first)  # claimed
