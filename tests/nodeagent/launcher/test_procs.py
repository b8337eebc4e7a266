"""The process helpers the supervisor relies on."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import psutil

from gpuplatform import procid
from nodeagent.launcher import procs, tracking
from tests.live import ROOT
from tests.nodeagent.launcher.conftest import wait_for


def test_exit_fd_becomes_readable_when_the_child_exits_and_not_before():
    read_end, write_end = os.pipe()
    child = subprocess.Popen(  # exits once the pipe closes: no timing involved
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=read_end
    )
    os.close(read_end)
    exited = procs.exit_fd(child.pid)
    assert exited is not None, "Linux >= 5.3 has pidfds"
    try:
        assert select.select([exited], [], [], 0)[0] == [], "still running"
        os.close(write_end)
        assert select.select([exited], [], [], 30)[0] == [exited]
        assert child.poll() == 0, "its status can be collected at once"
    finally:
        os.close(exited)


def test_start_time_is_what_psutil_says_for_the_same_process():
    import psutil

    # A process name with spaces and parentheses: the fields are counted after the last ")".
    child = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, "-c", ODD_NAME], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline() == b"ready\n"
        assert b"(odd) (x y) " in open(f"/proc/{child.pid}/stat", "rb").read()
        for pid in (os.getpid(), child.pid, 1):
            assert procid.start_time(pid) == psutil.Process(pid).create_time()
        assert procid.ProcessId.of(child.pid).alive()
    finally:
        child.kill()
        child.wait()


ODD_NAME = """
import sys
with open("/proc/self/comm", "w") as comm:
    comm.write("odd) (x y")
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_process_that_is_gone_has_no_process_id():
    child = subprocess.Popen(["/bin/true"])  # noqa: S603 - fixed argv
    child.wait()
    assert procid.ProcessId.of(child.pid) is None


def test_the_title_of_a_process_is_its_command_line_and_none_once_gone():
    child = subprocess.Popen(["sleep", "30"])
    try:
        wait_for(lambda: procs.title_of(child.pid) == "sleep 30")  # once exec is through
    finally:
        child.kill()
        child.wait()
    assert procs.title_of(child.pid) is None


DROP_THEN_TITLE = """
from nodeagent.launcher import environ, procs
environ.drop_secrets_from_environ()
procs.set_title("gpup-supervisor task=1 attempt=1")
print(procs.title_of(os.getpid()))
"""


def test_a_title_is_set_after_the_secrets_were_dropped_even_where_they_came_first():
    # Secrets first in the environment: unsetting them used to leave setproctitle unable to
    # set any title (ps showed the spawner's command line for every supervisor).
    env = {"DATABASE_URL": "postgres://x/y", "SECRET_KEY_FILE": "/nowhere", "PATH": "/bin"}
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]  # where Django was found, kept
    env.update(DJANGO_SETTINGS_MODULE="gpuplatform.settings", PYTHONPATH=os.pathsep.join(path))
    shown = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", "import os\n" + DROP_THEN_TITLE],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert shown.stdout.strip() == "gpup-supervisor task=1 attempt=1"


def test_a_killed_process_counts_as_stopped_before_anyone_reaps_it():
    """wait_stopped waits for death, not for the reaping an init may do only once a second."""
    child = subprocess.Popen(["sleep", "30"])  # noqa: S607
    proc = psutil.Process(child.pid)
    try:
        assert procs.wait_stopped([proc], timeout=0.2) == [proc]  # running: still there
        proc.kill()
        assert procs.wait_stopped([proc], timeout=10) == []
        assert proc.status() == psutil.STATUS_ZOMBIE  # not reaped: this test has not waited
    finally:
        child.kill()
        child.wait()


def in_a_fork(body) -> int:
    """Run ``body()`` in a forked child of this process, which has no child of its own; its
    exit status: 0 when ``body`` returned True, 1 when False, 2 when it raised."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            code = 0 if body() else 1
        except BaseException:  # noqa: BLE001 - any failure is the answer
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_tree_tracker_whose_command_left_nothing_stops_without_scanning_the_host():
    """Without cgroups (USE_CGROUPS=0), every attempt's end asked psutil for the supervisor's
    descendants two or three times, each a read of every process of the host: a node without
    cgroups ran slower than one with them. No child left means nothing to look for."""

    def stop() -> bool:
        def scan(*args, **kwargs):
            raise AssertionError("read every process of the host")

        procs.descendants = scan
        return tracking.TreeTracker().stop(5.0, keep=None)

    assert in_a_fork(stop) == 0


def test_a_tree_tracker_still_kills_what_the_command_left_behind():
    def stop() -> bool:
        procs.become_subreaper()
        subprocess.run(["/bin/sh", "-c", "sleep 600 & exit 0"], check=True)  # noqa: S603
        assert len(procs.descendants()) == 1, "the orphan is ours: we are its subreaper"
        return tracking.TreeTracker().stop(5.0, keep=None)  # True: nothing of it runs

    assert in_a_fork(stop) == 0
