"""What the scheduling tests share."""

from __future__ import annotations

import pytest

from scheduling import scheduler
from scheduling.spec import TaskSpec

# An online service that nothing may preempt: four of them fill a four-GPU workstation.
SERVICE = TaskSpec(name="svc", command="sleep 1000", task_class="online", preemptible=False,
                   priority=90)  # fmt: skip


@pytest.fixture
def run_pass(django_capture_on_commit_callbacks):
    """A pass, with what it does on commit (booking its wake-up, launches) done."""

    def run() -> scheduler.PassResult:
        with django_capture_on_commit_callbacks(execute=True):
            return scheduler.schedule_pass()

    return run
