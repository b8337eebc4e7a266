"""A pass queued for a scheduler that dies before starting it does not stall the estate: a
delayed check, run by any live scheduler, runs one in its place (issue 42, item 4; the
many-host test is tests/hosts/test_scheduler_failover.py)."""

from __future__ import annotations

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from scheduling import passes, tasks
from scheduling.models import PassRequest


def queued_stall_checks() -> list[tuple]:
    rows = OrmQ.objects.order_by("lock")
    return [
        (SignedPackage.loads(row.payload)["args"], row.lock)
        for row in rows
        if SignedPackage.loads(row.payload)["name"] == "scheduling-stall-check"
    ]


@pytest.mark.django_db
def test_a_pass_that_never_started_is_run_by_the_check():
    PassRequest.objects.update_or_create(pk=1, defaults={"queued": True, "started": 7})
    assert passes.stalled(7)
    result = tasks.run_pass_if_stalled(7)
    assert "placed" in result  # a pass ran
    flag = PassRequest.objects.get(pk=1)
    assert (flag.queued, flag.started) == (False, 8)


@pytest.mark.django_db
def test_the_check_does_nothing_once_a_pass_has_started_since():
    PassRequest.objects.update_or_create(pk=1, defaults={"queued": True, "started": 8})
    assert not passes.stalled(7)  # a later pass started; the flag is a newer request's
    assert tasks.run_pass_if_stalled(7) == {}
    assert PassRequest.objects.get(pk=1).started == 8


@pytest.mark.django_db(transaction=True)
def test_queueing_a_pass_books_a_check_a_moment_later(monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)
    PassRequest.objects.update_or_create(pk=1, defaults={"queued": False, "started": 3})
    passes.request_pass()  # outside a transaction: queued at once
    checks = queued_stall_checks()
    assert [args for args, _ in checks] == [(3,)]
    # The check is handed out only once the pass has had time to start.
    assert checks[0][1] > timezone.now()
