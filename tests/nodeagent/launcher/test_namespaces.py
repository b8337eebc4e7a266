"""What a task sees of its host: its own processes alone, a private /tmp, and signals and exit
statuses as without namespaces (nodeagent/launcher/namespaces.py, gpup_exec.c's -n).

Each test runs real tasks as their tenants' own users, and looks from inside them. They need
root and the exec helper; elsewhere they skip with the reason.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from nodeagent.launcher import identity, namespaces, supervisor
from scheduling import controls
from scheduling.models import Node
from tests.factories import TenantFactory
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_launch import log_of, running, start

CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


@pytest.fixture
def walled(launcher):
    """Tasks get namespaces here: root and the exec helper, looked up afresh."""
    if os.geteuid() != 0:
        pytest.skip("namespaces and tenant users need root")
    namespaces.unavailable.cache_clear()
    supervisor.exec_helper.cache_clear()
    why = namespaces.unavailable()
    if why is not None:
        pytest.skip(f"no namespaces for tasks here: {why}")
    yield launcher
    namespaces.unavailable.cache_clear()
    supervisor.exec_helper.cache_clear()


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


@pytest.fixture
def host_tmp_closed(walled):
    """A host whose /tmp is ``0755 root``, as this test's supervisors see it: this thread moves
    to a mount namespace of its own (the machine's /tmp is never touched; other agents use it),
    where a tmpfs of mode 0755 covers /tmp, with pytest's own directory bound back in."""
    libc = ctypes.CDLL(None, use_errno=True)
    kept = next((p for p in walled.parents if p.parent == Path("/tmp")), None)
    home = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY)
    cwd = os.getcwd()
    _check(libc.unshare(CLONE_NEWNS), "unshare")
    kept_fd = os.open(kept, os.O_PATH) if kept else None  # in the new namespace: bound below
    try:
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private")
        _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"mode=0755"), "tmpfs")
        if kept is not None:
            kept.mkdir()
            source = f"/proc/self/fd/{kept_fd}".encode()
            _check(libc.mount(source, str(kept).encode(), None, MS_BIND | MS_REC, None), "bind")
        yield walled
    finally:
        _check(libc.setns(home, CLONE_NEWNS), "setns")
        os.chdir(cwd)
        os.close(home)
        if kept_fd is not None:
            os.close(kept_fd)


def test_a_task_sees_its_own_processes_and_none_of_another_tenants(walled, node, lab):
    marker = f"other-tenant-{secrets.token_hex(4)}"
    other = start(TenantFactory(name="nlp-lab"), f"sleep 600; echo {marker}", name="b")
    running(other)
    looking = start(
        lab,
        "ps -eo user,args; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done",
        name="a",
    )
    wait_for(state_of(looking, "succeeded"))
    seen = log_of(looking)
    assert "ps -eo user,args" in seen  # it did look, and saw itself
    assert marker not in seen
    assert identity.tenant_user_name("nlp-lab") not in seen
    assert "root" not in seen.split()  # neither the supervisor nor anything else of the host
    controls.task_cancel(task=other)
    wait_for(state_of(other, "cancelled"))


WRITES_TMP = (
    'echo one > /tmp/mine && echo "$TMPDIR" > "$TMPDIR/two" && '
    'python3 -c "import tempfile; print(tempfile.mkstemp()[1])" && ls -A /tmp'
)


def test_a_task_writes_its_own_tmp_where_the_hosts_is_closed_and_it_is_gone_after(
    host_tmp_closed, node, lab
):
    host_tmp = os.stat("/tmp")
    assert (host_tmp.st_uid, oct(host_tmp.st_mode & 0o777)) == (0, "0o755")
    task = start(lab, WRITES_TMP)
    wait_for(state_of(task, "succeeded", "failed"))
    written = log_of(task)
    assert task.state == "succeeded", written
    lines = written.split()
    assert lines[0].startswith("/tmp/tmp") and {"mine", "two"} <= set(lines[1:]), written
    assert not Path("/tmp/mine").exists() and not Path("/tmp/two").exists()

    # Another tenant's task, after it: a /tmp of its own, empty but for what it writes.
    other = start(TenantFactory(name="nlp-lab"), "ls -A /tmp; cat /tmp/mine", name="b")
    wait_for(state_of(other, "failed"))
    assert "No such file" in log_of(other) and "two" not in log_of(other)
    # And the tenant's next task: its /tmp was emptied with the attempt.
    # (less the directory that holds the tenant's root, where that lies under /tmp)
    again = start(lab, 'ls -A /tmp | grep -vx "$(echo "$HOME" | cut -d/ -f3)"; echo end', "again")
    wait_for(state_of(again, "succeeded"))
    assert log_of(again) == "end\n"


TRAPS_TERM = """n=0; trap 'n=$((n+1))' TERM
echo "ready as $$ under $(tr '\\0' ' ' < /proc/1/cmdline | cut -c1-40)"
sleep 600 & wait; echo "TERM x$n"; exit 42"""


def test_sigterm_reaches_the_command_once_and_its_exit_status_is_kept(walled, node, lab):
    task = start(lab, TRAPS_TERM)
    running(task)
    wait_for(lambda: "ready" in log_of(task))
    assert log_of(task).startswith("ready as 2 under ")  # the namespace's init is PID 1
    controls.task_cancel(task=task)
    wait_for(state_of(task, "cancelled"))
    assert log_of(task).splitlines()[-1] == "TERM x1"
    assert task.exit_code == 42


@pytest.mark.parametrize(("command", "code"), [("exit 3", 3), ("kill -USR1 $$", 138)])
def test_exit_codes_and_deaths_by_signal_come_through_the_namespace(
    walled, node, lab, command, code
):
    task = start(lab, f"test $$ = 2 || echo not-in-a-namespace; {command}")
    wait_for(state_of(task, "failed"))
    assert (task.exit_code, log_of(task)) == (code, "")


def test_a_node_says_whether_its_tasks_get_namespaces(walled, node, settings):
    from nodeagent.agent import NodeAgent
    from scheduling.config import EstateConfig

    simulate = {"model": "NVIDIA GeForce RTX 4090", "memory": "24Gi", "count": 1}
    config = EstateConfig.model_validate({"nodes": [{"name": "box", "simulate": simulate}]})
    NodeAgent(config=config, node_name="box", backend_kind="simulated").register()
    isolation = Node.objects.get(name="box").isolation
    assert isolation.startswith("tenant users; ") and isolation.endswith(f"; {namespaces.ENABLED}")

    settings.TASK_NAMESPACES = False
    namespaces.unavailable.cache_clear()
    NodeAgent(config=config, node_name="box", backend_kind="simulated").register()
    assert Node.objects.get(name="box").isolation.endswith(
        "; no PID/mount namespaces: TASK_NAMESPACES is off"
    )
    # And its tasks run as before: in the host's process list, with no TMPDIR of ours.
    lab = TenantFactory(name="vision-lab")
    task = start(lab, 'test $$ != 2 && echo "host tmp=${TMPDIR:-unset}"')
    wait_for(state_of(task, "succeeded"))
    assert log_of(task) == "host tmp=unset\n"


def test_the_helper_names_a_bad_tmp_size_and_exits_126(tmp_path):
    helper = settings.TASK_EXEC_HELPER
    if not (helper and os.access(helper, os.X_OK)):
        pytest.skip(f"the exec helper is not built ({helper}): make builds it where cc exists")
    done = subprocess.run(  # noqa: S603 - our own helper
        [helper, "-n", "8Gi", "-", "-", str(tmp_path), "0", "/bin/true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 126
    assert "bad tmp size 8Gi" in done.stderr
