"""What the scheduling tests share."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from scheduling import scheduler
from scheduling.spec import TaskSpec
from tests.live import PYTHON, ROOT, process_env

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


def shipped_config_with(settings, tmp_path, line: str, replacement: str):
    """The shipped configs/scheduler.yaml with ``line`` replaced, as GPUPLATFORM_CONFIG for this
    process and for the clusters it starts (``scheduler_cluster``)."""
    shipped = (ROOT / "configs" / "scheduler.yaml").read_text()
    assert line in shipped
    path = tmp_path / "scheduler.yaml"
    path.write_text(shipped.replace(line, replacement))
    settings.GPUPLATFORM_CONFIG = str(path)
    return path


@pytest.fixture
def scheduler_cluster(settings):
    """``manage.py scheduler`` as `make run` starts it, exchanging work through the broker,
    reading the configuration this process reads."""
    environ = process_env(Q_SYNC="0", GPUPLATFORM_CONFIG=str(settings.GPUPLATFORM_CONFIG))
    environ.pop("Q_CLUSTER_NAME", None)
    proc = subprocess.Popen(
        [PYTHON, "manage.py", "scheduler"],
        cwd=ROOT,
        env=environ,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
