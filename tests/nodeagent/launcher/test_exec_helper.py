"""The task exec helper (``gpup-exec``, nodeagent/launcher/gpup_exec.c): cgroup, user, work
directory, then the command; and a supervisor that starts tasks through it or, without it, the
same way in Python."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from nodeagent.launcher import supervisor, tracking
from scheduling import scheduler
from scheduling.models import TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.nodeagent.launcher.conftest import TEST_CGROUP, state_of, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing users needs root")
NOBODY = 65534


@pytest.fixture
def helper() -> str:
    path = settings.TASK_EXEC_HELPER
    if not (path and os.access(path, os.X_OK)):
        pytest.skip(f"the exec helper is not built ({path}): make builds it where cc exists")
    return path


def run(helper: str, *args: str, user=("-", "-")) -> subprocess.CompletedProcess:
    return subprocess.run(
        [helper, *user, *args], capture_output=True, text=True, check=False, timeout=30
    )


def test_the_helper_is_built_wherever_there_is_a_compiler():
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here: supervisors start tasks through Python")
    assert os.access(settings.TASK_EXEC_HELPER, os.X_OK), settings.TASK_EXEC_HELPER


def test_it_makes_and_enters_the_work_directory_with_a_private_umask(helper, tmp_path):
    workdir = tmp_path / "a" / "b" / "c"
    done = run(helper, str(workdir), "0", "/bin/sh", "-c", "pwd; umask")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(workdir), "0077"]
    assert (workdir.stat().st_mode & 0o777) == 0o700
    assert run(helper, str(workdir), "0", "/bin/true").returncode == 0  # it exists: fine


def test_the_environment_given_is_the_commands(helper, tmp_path):
    done = subprocess.run(
        [helper, "-", "-", str(tmp_path), "0", "/bin/sh", "-c", 'echo "$GREETING"'],
        env={"GREETING": "hello"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "hello\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent-dir/x", "0", "/bin/true"], "cannot make the work directory"),
        (["{tmp}", "1", "/nonexistent-cgroup/cgroup.procs", "/bin/true"],
         "cannot join the attempt's cgroup /nonexistent-cgroup/cgroup.procs"),
        (["{tmp}", "3", "/bin/true"], "bad cgroup count 3"),
        (["{tmp}", "0", "/nonexistent-program"], "cannot run /nonexistent-program"),
    ],
)  # fmt: skip
def test_what_it_cannot_do_is_said_and_exits_126(helper, tmp_path, args, message):
    if os.geteuid() == 0 and args[0] == "/nonexistent-dir/x":
        args = ["/proc/1/nonexistent", *args[1:]]  # root may make /nonexistent-dir
    done = run(helper, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert done.returncode == 126
    assert done.stderr.startswith("gpuplatform: cannot prepare the task: ")
    assert message in done.stderr


@needs_root
def test_it_becomes_the_user_for_good_with_no_extra_groups(helper, tmp_path):
    tmp_path.chmod(0o777)
    workdir = tmp_path / "home" / "work"
    done = run(helper, str(workdir), "0", "/bin/sh", "-c", "id -u; id -g; id -G",
               user=(str(NOBODY), str(NOBODY)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(NOBODY)] * 3
    assert workdir.stat().st_uid == NOBODY  # made as the user, not as root


@needs_root
def test_as_the_user_it_cannot_enter_what_root_could(helper, tmp_path):
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    done = run(helper, str(private), "0", "/bin/true", user=(str(NOBODY), str(NOBODY)))
    assert done.returncode == 126
    assert f"work directory {private}: Permission denied" in done.stderr


# --- Through a supervisor, with the helper and without ---------------------------------------


@pytest.fixture(params=["helper", "python"])
def start_mode(request, settings):
    if request.param == "python":
        settings.TASK_EXEC_HELPER = ""
    elif not os.access(settings.TASK_EXEC_HELPER or "", os.X_OK):
        pytest.skip("the exec helper is not built")
    supervisor.exec_helper.cache_clear()
    yield request.param
    supervisor.exec_helper.cache_clear()


PROBE = "pwd; umask; id -u; cat /proc/self/cgroup"


def test_a_task_starts_in_its_cgroup_workdir_and_user_either_way(launcher, node, lab, start_mode):
    task = task_submit(tenant=lab, spec=TaskSpec(name="probe", command=PROBE, workdir="w/x"))
    scheduler.schedule_pass()
    wait_for(state_of(task, "succeeded"))
    attempt = TaskAttempt.objects.get(task=task)
    pwd, umask, uid, *cgroup_lines = Path(attempt.log_path).read_text().split()
    assert pwd == str(Path(settings.TASKS_ROOT, lab.name, "w", "x").resolve())
    assert umask == "0077"
    if os.geteuid() == 0:
        assert int(uid) != 0  # root runs no task: the tenant's own user does
    else:
        assert int(uid) == os.geteuid()  # single-user mode
    assert int(uid) == Path(pwd).stat().st_uid  # the directory was made by the task's user
    if tracking.hierarchy() is not None:
        assert any(TEST_CGROUP in line for line in cgroup_lines), cgroup_lines


def test_the_argv_puts_the_helper_before_the_shell():
    class Tracker:
        procs_files = (b"/sys/fs/cgroup/unified/x/cgroup.procs",)

    class Who:
        uid, gid = 1001, 1002

    shell = ["/bin/sh", "-c", "echo hi"]
    assert supervisor.task_argv(None, Tracker(), Who(), "/w", "echo hi") == shell
    assert supervisor.task_argv("/h", Tracker(), Who(), "/w", "echo hi") == [
        "/h", "1001", "1002", "/w", "1", "/sys/fs/cgroup/unified/x/cgroup.procs", *shell,
    ]  # fmt: skip
    assert supervisor.task_argv("/h", tracking.TreeTracker(), None, "/w", "echo hi") == [
        "/h", "-", "-", "/w", "0", *shell,
    ]  # fmt: skip
