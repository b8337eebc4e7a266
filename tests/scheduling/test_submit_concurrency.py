"""Submissions of one tenant at the same instant, against real PostgreSQL.

The queue cap (``max_queued_tasks``) is checked under a per-tenant advisory lock held only for
the count and the INSERTs; without it two batches could each count the queue before the other
committed and both pass. Threads here each hold a connection of their own and start every
round together, so their checks overlap.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, connections, transaction

from scheduling import passes
from scheduling.models import Task
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import SubmitError, tasks_submit
from tenants.models import Quota, Tenant
from tests.factories import TenantFactory

SUBMITTERS = 8
ROUNDS = 6
BATCH = 2
CAP = 13  # odd, so a batch of two can end exactly one short of it


@pytest.fixture
def no_passes(monkeypatch):
    # Passes would move tasks out of the queue while the submitters fill it.
    monkeypatch.setattr(passes, "request_pass", lambda claimed=None: None)


def _submitter(tenant_pk: int, index: int, start: threading.Barrier, outcomes: Counter,
               lock: threading.Lock) -> None:  # fmt: skip
    tenant = Tenant.objects.get(pk=tenant_pk)
    try:
        for round_ in range(ROUNDS):
            specs = [TaskSpec(name=f"s{index}-r{round_}-{n}", command="true") for n in range(BATCH)]
            start.wait(timeout=30)
            try:
                tasks_submit(tenant=tenant, specs=specs)
                outcome = "accepted"
            except SubmitError as exc:
                outcome = "refused" if "quota" in exc.errors else f"other: {exc.errors}"
            with lock:
                outcomes[outcome] += 1
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_never_queue_more_than_the_cap(workstation, no_passes):
    tenant = TenantFactory(name="busy-lab")
    Quota.objects.create(tenant=tenant, max_queued_tasks=CAP)
    start = threading.Barrier(SUBMITTERS)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_submitter, args=(tenant.pk, i, start, outcomes, lock))
        for i in range(SUBMITTERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)

    queued = Task.objects.filter(tenant=tenant, state=TaskState.PENDING).count()
    assert queued <= CAP
    # Every accepted batch is there whole, and the cap was reached: the refusals were needed.
    assert queued == outcomes["accepted"] * BATCH == CAP - 1
    assert outcomes["accepted"] + outcomes["refused"] == SUBMITTERS * ROUNDS, outcomes


@pytest.mark.django_db(transaction=True)
def test_queued_tasks_leaving_the_queue_make_room_again(workstation, no_passes):
    tenant = TenantFactory(name="busy-lab")
    Quota.objects.create(tenant=tenant, max_queued_tasks=2)
    spec = TaskSpec(name="t", command="true")
    first, _ = tasks_submit(tenant=tenant, specs=[spec, spec])
    with pytest.raises(SubmitError):
        tasks_submit(tenant=tenant, specs=[spec])
    Task.objects.filter(pk=first.pk).update(state=TaskState.CANCELLED)
    tasks_submit(tenant=tenant, specs=[spec])


@pytest.mark.django_db(transaction=True)
def test_a_submission_in_progress_blocks_neither_the_tenant_nor_its_other_submissions(
    workstation, no_passes
):
    """With no queue cap, nothing of the tenant is locked: while one submission's transaction
    is still open, another submission of the same tenant commits and the tenant's row can be
    updated (the submit path used to hold the tenant row FOR UPDATE for its whole request)."""
    tenant = TenantFactory(name="busy-lab")
    inserted, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def slow_submission() -> None:
        try:
            with transaction.atomic():
                tasks_submit(tenant=Tenant.objects.get(pk=tenant.pk), specs=[TaskSpec(
                    name="slow", command="true")])  # fmt: skip
                inserted.set()
                assert release.wait(timeout=30)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)
            inserted.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_submission)
    thread.start()
    try:
        assert inserted.wait(timeout=30)
        with connection.cursor() as cursor:
            # Fail, rather than hang, if anything waits for the other transaction.
            cursor.execute("SET lock_timeout = '5s'")
        with transaction.atomic():
            tasks_submit(tenant=tenant, specs=[TaskSpec(name="quick", command="true")])
            Tenant.objects.filter(pk=tenant.pk).update(description="edited meanwhile")
        assert Task.objects.filter(tenant=tenant).count() == 1  # only the committed one
    finally:
        release.set()
        thread.join(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not failures, failures
    assert set(Task.objects.filter(tenant=tenant).values_list("name", flat=True)) == {
        "slow",
        "quick",
    }
