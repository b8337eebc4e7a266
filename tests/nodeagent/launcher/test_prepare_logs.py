"""An attempt's log directories: made as a launch needs them, again if removed since."""

from __future__ import annotations

import shutil
import stat

from nodeagent.launcher import lifecycle
from scheduling import paths
from scheduling.agentapi.messages import Assignment


def assignment(task_id: int, attempt: int = 1) -> Assignment:
    return Assignment(
        attempt_id=task_id * 10 + attempt, task_id=task_id, attempt_no=attempt, node="n",
        tenant="lab", unix_user="", task_name="t", command="true", workdir="",
        log_path=str(paths.log_path("lab", task_id, attempt)),
    )  # fmt: skip


def test_made_private_then_found_then_made_again_once_removed(settings, tmp_path):
    settings.TASK_LOG_DIR = str(tmp_path / "logs")
    lifecycle._TENANT_LOG_DIRS.clear()

    lifecycle.prepare_logs(assignment(1))
    tenant = tmp_path / "logs" / "lab"
    assert (tenant / "1").is_dir()
    for directory in (tmp_path / "logs", tenant, tenant / "1"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    lifecycle.prepare_logs(assignment(2))  # the tenant's directory is known: only the task's
    lifecycle.prepare_logs(assignment(2, attempt=2))  # a retry: its task's directory exists
    assert (tenant / "2").is_dir()

    shutil.rmtree(tmp_path / "logs")  # an operator cleaned up while the agent ran
    lifecycle.prepare_logs(assignment(3))
    assert (tenant / "3").is_dir()
    assert stat.S_IMODE(tenant.stat().st_mode) == 0o700
