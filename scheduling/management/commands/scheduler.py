"""``manage.py scheduler``: the control plane's background work in one process.

Passes, the backstop and telemetry schedules, stall checks and alert webhooks are queued on the
scheduler's queue (``Q_CLUSTER["name"]``); this command takes them with
``gpuplatform.jobrunner.JobRunner`` on ``Q_WORKERS`` threads, where ``manage.py qcluster``
(django-q2's own cluster, still usable: same queue, same broker) takes them with a tree of six
processes. Two hosts may each run one: passes serialise on an advisory lock, schedules on their
rows' locks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand

from gpuplatform import gctune
from gpuplatform.jobrunner import JobRunner

# The modules whose functions the scheduler's queue carries; a job naming any other function
# (a node's launch, anything else a signed payload could name) is refused.
JOB_MODULES = ("scheduling.tasks", "telemetry.tasks", "monitoring.tasks")


def resolve(name: str) -> Callable | None:
    module, _, func = name.rpartition(".")
    if module not in JOB_MODULES or func.startswith("_"):
        return None
    found = getattr(importlib.import_module(module), func, None)
    return found if callable(found) else None


class Command(BaseCommand):
    help = "Run passes, schedules and the control plane's other jobs (Q_WORKERS threads)."

    def handle(self, *args, **options):
        for module in JOB_MODULES:  # loaded now, not on a worker thread in the first job
            importlib.import_module(module)
        if "gc" not in settings.GPUPLATFORM_STOCK:
            gctune.settle()
        runner = JobRunner(
            settings.Q_CLUSTER["name"], workers=settings.Q_CLUSTER["workers"], resolve=resolve
        )
        runner.stop_on_signals()
        runner.run()
