"""Requests for a scheduling pass: coalesced, and always queued for the scheduler's cluster."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling import passes, scheduler
from scheduling.models import SchedulerState


@pytest.fixture
def queued(monkeypatch):
    calls = []
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: calls.append(kwargs))
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_pass_is_queued_for_the_scheduler_even_from_a_nodes_process(queued, monkeypatch):
    # What a supervisor forked from a node's launch worker carries in its environment.
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
    assert SchedulerState.objects.get(pk=1).pass_queued


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
    assert SchedulerState.objects.get(pk=1).pass_queued


@pytest.mark.django_db(transaction=True)
def test_a_request_after_a_running_pass_read_its_snapshot_queues_another(queued, monkeypatch):
    # The pass runs in a thread (its own connection) and stops once it has read its snapshot;
    # a task committed now is not in it, so the request that follows must queue a pass.
    scheduler.schedule_pass()  # keeps the fair-share counters: the pass below locks no rows
    passes.request_pass()
    read, release = threading.Event(), threading.Event()
    build_snapshot = scheduler.build_snapshot

    def snapshot_then_wait(*args, **kwargs):
        snapshot = build_snapshot(*args, **kwargs)
        read.set()
        release.wait(timeout=30)
        return snapshot

    def run_pass():
        try:
            scheduler.schedule_pass()
        finally:
            connection.close()

    monkeypatch.setattr(scheduler, "build_snapshot", snapshot_then_wait)
    running = threading.Thread(target=run_pass)
    running.start()
    try:
        assert read.wait(timeout=30)
        passes.request_pass()
        assert [call["task_name"] for call in queued] == ["scheduling-pass"] * 2
    finally:
        release.set()
        running.join(timeout=30)


@pytest.mark.django_db
def test_the_backstop_schedules_run_only_on_the_scheduler_s_cluster():
    from django_q.models import Schedule

    passes.backstops_ensure()
    assert set(Schedule.objects.values_list("cluster", flat=True)) == {"gpuplatform"}
