"""Supervisors leave the node agent's systemd unit (nodeagent.launcher.unitcgroup), so that
``systemctl restart gpuplatform-agent`` never kills them: checked without systemd, on parsed
texts, on a fake hierarchy, and as root on this host's real cgroups with a stand-in unit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nodeagent.launcher import cgroups, unitcgroup

HYBRID = (
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
PURE_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_it_names_the_service_the_agent_runs_in():
    pure = cgroups.parse_proc_cgroup("0::/system.slice/gpuplatform-agent.service\n")
    hybrid = cgroups.parse_proc_cgroup(
        "9:name=systemd:/system.slice/gpuplatform-agent.service\n4:memory:/\n0::/\n"
    )
    started = {"INVOCATION_ID": "0123abcd"}
    assert unitcgroup.service_unit(pure, started) == "gpuplatform-agent.service"
    assert unitcgroup.service_unit(hybrid, started) == "gpuplatform-agent.service"


def test_it_names_no_service_outside_systemd_or_in_a_session():
    service = cgroups.parse_proc_cgroup("0::/system.slice/gpuplatform-agent.service\n")
    session = cgroups.parse_proc_cgroup("0::/user.slice/user-0.slice/session-3.scope\n")
    assert unitcgroup.service_unit(service, {}) is None, "no INVOCATION_ID: not started by it"
    assert unitcgroup.service_unit(session, {"INVOCATION_ID": "x"}) is None
    assert (
        unitcgroup.service_unit(cgroups.parse_proc_cgroup("0::/\n"), {"INVOCATION_ID": "x"}) is None
    )


def test_the_leaves_are_in_v2_and_in_systemds_own_hierarchy_only():
    assert unitcgroup.targets(HYBRID, "gpuplatform", "gpu-a") == [
        Path("/sys/fs/cgroup/systemd/gpuplatform/gpu-a/supervisors"),
        Path("/sys/fs/cgroup/unified/gpuplatform/gpu-a/supervisors"),
    ]
    assert unitcgroup.targets(PURE_V2, "gpuplatform", "gpu-a") == [
        Path("/sys/fs/cgroup/gpuplatform/gpu-a/supervisors")
    ]
    container = "41 31 0:38 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert unitcgroup.targets(container, "gpuplatform", "gpu-a") == [], "not its root"


def fake_proc(tmp_path: Path, own_cgroup: str) -> tuple[Path, Path, Path]:
    """A /proc/self with a hybrid host's mounts pointing into ``tmp_path``."""
    proc, named, unified = tmp_path / "proc", tmp_path / "systemd", tmp_path / "unified"
    for directory in (proc, named, unified):
        directory.mkdir()
    (proc / "mountinfo").write_text(
        f"40 31 0:37 / {named} rw - cgroup cgroup rw,name=systemd\n"
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
    )
    (proc / "cgroup").write_text(f"9:name=systemd:{own_cgroup}\n0::{own_cgroup}\n")
    return proc, named, unified


@pytest.mark.skipif(os.geteuid() != 0, reason="the leaves are made only as root")
def test_it_prepares_the_leaves_and_a_supervisor_joins_them(tmp_path):
    proc, named, unified = fake_proc(tmp_path, "/system.slice/gpuplatform-agent.service")
    files, said = unitcgroup.prepare(
        "gpuplatform", "gpu-a", environ={"INVOCATION_ID": "x"}, proc=proc
    )
    leaves = [named / "gpuplatform/gpu-a/supervisors", unified / "gpuplatform/gpu-a/supervisors"]
    assert files == tuple(os.fsencode(leaf / "cgroup.procs") for leaf in leaves)
    assert "in gpuplatform-agent.service; supervisors move to" in said
    for leaf in leaves:  # a real cgroup has this file from its mkdir
        (leaf / "cgroup.procs").write_text("")
    unitcgroup.leave(files)
    assert [(leaf / "cgroup.procs").read_text() for leaf in leaves] == ["0", "0"]


def test_it_prepares_nothing_outside_a_service(tmp_path):
    proc, named, unified = fake_proc(tmp_path, "/user.slice/user-0.slice/session-3.scope")
    files, said = unitcgroup.prepare(
        "gpuplatform", "gpu-a", environ={"INVOCATION_ID": "x"}, proc=proc
    )
    assert files == ()
    assert said == "not a systemd service: supervisors stay where they are forked"
    assert not (unified / "gpuplatform").exists()
    unitcgroup.leave(files)  # nothing to do, and no error


# --- For real, as root: a stand-in unit's cgroup, killed as systemd kills it -------------------

CHILD = """
import os, sys, time
from nodeagent.launcher import unitcgroup
for path in sys.argv[3:]:
    with open(path, "w") as f:
        f.write("0")
files, said = unitcgroup.prepare(sys.argv[1], sys.argv[2])
unitcgroup.leave(files)
print(said, flush=True)
time.sleep(120)
"""


def real_mounts() -> dict[str, Path]:
    mounts = cgroups.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    found = {}
    for mount in mounts:
        if mount.root != "/":
            continue
        if mount.version == 2:
            found.setdefault("unified", mount.path)
        elif "name=systemd" in mount.options:
            found.setdefault("systemd", mount.path)
    return found


def unit_cgroups_usable() -> str | None:
    if os.geteuid() != 0:
        return "moving processes between cgroups needs root"
    if "unified" not in real_mounts():
        return "no cgroup v2 hierarchy mounted at its root here"
    return None


@pytest.mark.skipif(unit_cgroups_usable() is not None, reason=str(unit_cgroups_usable()))
def test_a_supervisor_outlives_the_kill_of_its_units_cgroup():
    tag = f"gpup-unittest-{uuid.uuid4().hex[:8]}"
    mounts = real_mounts()
    units = {name: base / tag / "fake-agent.service" for name, base in mounts.items()}
    for directory in units.values():
        directory.mkdir(parents=True)
    platform = f"{tag}-platform"
    child = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        [
            sys.executable,
            "-c",
            CHILD,
            platform,
            "gpu-a",
            *(str(d / "cgroup.procs") for d in units.values()),
        ],
        env={**os.environ, "INVOCATION_ID": "0123abcd"},
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        said = child.stdout.readline()
        assert "in fake-agent.service; supervisors move to" in said, said
        own = cgroups.parse_proc_cgroup(Path(f"/proc/{child.pid}/cgroup").read_text())
        assert own[""] == f"/{platform}/gpu-a/supervisors"
        if "systemd" in mounts:
            assert own["name=systemd"] == f"/{platform}/gpu-a/supervisors"
        # What KillMode=control-group does to the unit: kill every process in its cgroup.
        for directory in units.values():
            for pid in (directory / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)
        assert child.poll() is None, "the supervisor died with its unit"
    finally:
        child.kill()
        child.wait()
        for base in mounts.values():
            leaf = base / platform / "gpu-a" / "supervisors"
            unit = base / tag / "fake-agent.service"
            for directory in (leaf, leaf.parent, leaf.parent.parent, unit, unit.parent):
                deadline = time.monotonic() + 5
                while directory.exists():
                    try:
                        directory.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(unit_cgroups_usable() is not None, reason=str(unit_cgroups_usable()))
def test_a_spawner_in_a_systemd_unit_forks_supervisors_outside_it(launcher, listening, lab, node):
    """The node's spawner started in a stand-in ``gpuplatform-agent.service`` (its cgroup in
    v2 and name=systemd, INVOCATION_ID set): its supervisor is outside the unit, and killing
    every process of the unit, as ``systemctl stop`` does, leaves the task to succeed."""
    from tests.live import PYTHON, ROOT, process_env
    from tests.nodeagent.launcher.conftest import TEST_CGROUP, state_of, wait_for
    from tests.nodeagent.launcher.test_spawner import listens, submit, supervisor_of

    tag = f"gpup-unittest-{uuid.uuid4().hex[:8]}"
    mounts = real_mounts()
    units = [base / tag / "gpuplatform-agent.service" for base in mounts.values()]
    for directory in units:
        directory.mkdir(parents=True)

    def join_unit() -> None:
        for directory in units:
            (directory / "cgroup.procs").write_text("0")

    spawner = subprocess.Popen(  # noqa: S603 - fixed argv
        [PYTHON, "-m", "nodeagent.launcher.spawner", node.name],
        cwd=ROOT,
        env=process_env(INVOCATION_ID="0123abcd"),
        preexec_fn=join_unit,  # noqa: PLW1509 - only writes, before exec
    )
    # The launcher fixture removes the test's v2 cgroups, supervisors' leaf included, but not
    # what name=systemd holds.
    named = (
        [mounts["systemd"] / TEST_CGROUP / node.name / "supervisors"] if "systemd" in mounts else []
    )
    try:
        wait_for(lambda: listens(node.name))
        task = submit(lab, "sleep 2; echo done")
        wait_for(state_of(task, "running"))
        supervisor = supervisor_of(task)
        own = cgroups.parse_proc_cgroup(Path(f"/proc/{supervisor.pid}/cgroup").read_text())
        assert own[""] == f"/{TEST_CGROUP}/{node.name}/supervisors"
        if "systemd" in mounts:
            assert own["name=systemd"] == f"/{TEST_CGROUP}/{node.name}/supervisors"
        for directory in units:  # systemctl stop, KillMode=control-group
            for pid in (directory / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        spawner.wait(timeout=10)
        wait_for(state_of(task, "succeeded"))
    finally:
        if spawner.poll() is None:
            spawner.kill()
            spawner.wait()
        # The idle supervisor leaves once its spawner is gone; then the leaves can go.
        doomed = [*named, *(leaf.parent for leaf in named), *(leaf.parent.parent for leaf in named)]
        for directory in [*doomed, *units, *(unit.parent for unit in units)]:
            deadline = time.monotonic() + 10
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
