"""Asking for a scheduling pass, coalesced.

Every event that can free or need capacity (submit, finish, cancel, node change, quota change)
calls ``request_pass()``. It queues a django-q2 task only if none is queued yet, so a burst of
1,000 submissions queues one pass (plus at most one more that starts after the first began and
sees what arrived meanwhile). A one-minute schedule runs a pass anyway, so a lost request costs
at most a minute.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task

from scheduling.models import SchedulerState

logger = logging.getLogger(__name__)


def request_pass() -> None:
    """Queue a pass once the current transaction commits (so the pass sees its writes)."""
    transaction.on_commit(_enqueue)


def _enqueue() -> None:
    claimed = SchedulerState.objects.filter(pk=1, pass_queued=False).update(pass_queued=True)
    if not claimed:
        _, created = SchedulerState.objects.get_or_create(pk=1, defaults={"pass_queued": True})
        if not created:
            return  # a pass is queued and has not started: it will see this change
    # Named, never implied: a supervisor forked from a node's launch worker inherits
    # Q_CLUSTER_NAME=<node>, and a pass queued there would block that node's launches.
    async_task(
        "scheduling.tasks.run_pass", task_name="scheduling-pass", cluster=scheduler_cluster()
    )


def scheduler_cluster() -> str:
    """The django-q2 cluster that runs passes (``manage.py qcluster`` with no Q_CLUSTER_NAME)."""
    return settings.Q_CLUSTER["name"]


def mark_started() -> None:
    """Called by a pass as it starts: requests from now on need a pass of their own."""
    SchedulerState.objects.filter(pk=1).update(pass_queued=False)
