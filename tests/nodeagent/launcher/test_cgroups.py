"""Attempt cgroups against the real kernel: real processes, real cgroups, no database.

Every test makes its cgroups under a top-level name of its own (pid and counter) and removes
them, with anything still running in them, whatever the outcome.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nodeagent.launcher import cgroups
from nodeagent.launcher.cgroups import AttemptCgroup, CgroupError, Limits
from tests.nodeagent.launcher.conftest import wait_for as launcher_wait_for

NOBODY = 65534
_names = itertools.count(1)

SETSID = "setsid sleep 300 & sleep 300"

# Forks, lets the parent exit, starts a session, forks again: a classic daemon whose parent
# is gone before the test even looks. It reports its pid through a file.
DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

# Counts as fast as it can into a file (replaced whole, so a reader never sees half a number),
# with a setsid child doing the same, so a freeze has two sessions to stop.
COUNTER = """
import os, sys, time
path = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    path += ".child"
i = 0
while True:
    i += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(i))
    os.replace(path + ".tmp", path)
    time.sleep(0.005)
"""

FORKS = """
import os, sys, time
made = failed = 0
for _ in range(10):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    made += 1
with open(sys.argv[1], "w") as f:
    f.write(f"{made} {failed}")
"""


FORK_BOMB = """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
"""


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "cgroups need root"
    cgroups.detect.cache_clear()
    if cgroups.detect() is None:
        return "no writable cgroup hierarchy with a freezer or cgroup v2 on this host"
    return None


def _freezer_mount() -> Path | None:
    mounts = cgroups.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    return next((m.path for m in mounts if m.version == 1 and "freezer" in m.options), None)


@pytest.fixture
def hierarchy() -> cgroups.Hierarchy:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    return cgroups.detect()


@pytest.fixture(params=["v2", "v2 freeze-kill", "v1 freezer"])
def flavour(request, hierarchy) -> cgroups.Hierarchy:
    """The host's hierarchy, and the fallbacks it can emulate: a v2 without cgroup.kill (kernels
    5.2-5.13) and pure v1 (freezer tracks), so every kill path runs here."""
    if request.param == "v2":
        if hierarchy.unified is None:
            pytest.skip("no usable cgroup v2 on this host")
        return hierarchy
    if request.param == "v2 freeze-kill":
        if hierarchy.unified is None:
            pytest.skip("no usable cgroup v2 on this host")
        return dataclasses.replace(hierarchy, unified_kill=False)
    freezer = hierarchy.freezer or _freezer_mount()
    if freezer is None:
        pytest.skip("no v1 freezer on this host")
    return dataclasses.replace(
        hierarchy, unified=None, unified_controllers=(), unified_kill=False, freezer=freezer
    )


class Made:
    """Creates attempt cgroups under this test's own top-level name and cleans up after it."""

    def __init__(self, hierarchy: cgroups.Hierarchy) -> None:
        self.hierarchy = hierarchy
        self.top = f"gpuplatform-cgtest-{os.getpid()}-{next(_names)}"
        self.popens: list[subprocess.Popen] = []

    def create(self, *parts: str, limits: Limits = Limits()) -> AttemptCgroup:  # noqa: B008
        return AttemptCgroup.create(self.hierarchy, self.top, "node-1", *parts, limits=limits)

    def start(self, argv: list[str], group: AttemptCgroup, preexec=None) -> subprocess.Popen:
        proc = subprocess.Popen(  # noqa: PLW1509
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec or group.join_current_process,
        )
        self.popens.append(proc)
        return proc

    def cleanup(self) -> None:
        """Kill everything under the top name in every hierarchy used, then rmdir bottom up."""
        bases = set(self.hierarchy.bases()) | {cgroups.detect().tracker()}
        for base in bases:
            top = base / self.top
            if not top.exists():
                continue
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                _force_empty(directory)
                directory.rmdir()
            _force_empty(top)
            top.rmdir()
        for proc in self.popens:
            proc.kill()
            proc.wait(timeout=10)


def _force_empty(directory: Path) -> None:
    """Kill whatever is in one cgroup directory, thawing it first if it is a frozen v1 one."""
    for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
        if (directory / name).exists():
            (directory / name).write_text(value)
    for _ in range(100):
        pids = (directory / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


@pytest.fixture
def made(flavour):
    made = Made(flavour)
    yield made
    made.cleanup()


@pytest.fixture
def host(hierarchy):
    """Like ``made``, on the host's own hierarchy only (tests that do not depend on the flavour)."""
    made = Made(hierarchy)
    yield made
    made.cleanup()


def wait_for(predicate, timeout: float = 10.0):
    return launcher_wait_for(predicate, timeout=timeout, every=0.02)


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie its parent has not collected yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return 0


# --- detection ---------------------------------------------------------------------------------


def test_detect_finds_this_hosts_hierarchy_and_describe_names_it(hierarchy):
    mounts = cgroups.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    described = hierarchy.describe()
    unified = [m for m in mounts if m.version == 2]
    if unified and hierarchy.unified is not None:
        assert hierarchy.unified.is_relative_to(unified[0].path)
        assert f"cgroup v2 ({hierarchy.unified})" in described
    else:
        assert hierarchy.freezer is not None
        assert "v1 freezer" in described
    for controller in cgroups.LIMIT_CONTROLLERS:
        in_v1 = any(m.version == 1 and controller in m.options for m in mounts)
        if in_v1:
            assert controller in described, f"v1 {controller} is mounted here"
            assert hierarchy.location(controller) is not None
    assert cgroups.detect() is cgroups.detect(), "detect() is cached per process"


def test_it_reads_a_pure_v2_and_a_hybrid_mountinfo():
    pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    hybrid = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "42 31 0:39 /docker/x /mnt/my\\040cg rw shared:5 - cgroup cgroup rw,memory\n"
    )
    (mount,) = cgroups.parse_mountinfo(pure)
    assert (mount.path, mount.version) == (Path("/sys/fs/cgroup"), 2)
    cpu, unified, memory = cgroups.parse_mountinfo(hybrid)
    assert cpu.path == Path("/sys/fs/cgroup/cpu,cpuacct") and {"cpu", "cpuacct"} <= cpu.options
    assert (unified.path, unified.version) == (Path("/sys/fs/cgroup/unified"), 2)
    assert (memory.path, memory.root) == (Path("/mnt/my cg"), "/docker/x")
    own = cgroups.parse_proc_cgroup("4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice\n")
    assert own == {"memory": "/process_api/abc", "cpu": "/", "cpuacct": "/", "": "/user.slice"}


def test_favordynmods_is_added_to_the_v2_mount_and_its_other_options_kept():
    mounts = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 "
        "- cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
    )
    source, target, fstype, flags, data = cgroups.favor_dynmods_mount(mounts)
    assert (source, target, fstype) == ("cgroup2", "/sys/fs/cgroup/unified", "cgroup2")
    # MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME: a remount without them
    # would clear them.
    assert flags == 32 | 2 | 4 | 8 | 1 << 21
    assert data == "memory_recursiveprot,nsdelegate,favordynmods"
    on = mounts.replace("rw,nsdelegate,", "rw,nsdelegate,favordynmods,")
    assert cgroups.favor_dynmods_mount(on) is None
    assert cgroups.favor_dynmods_mount(mounts.splitlines()[0]) is None  # no v2 mount


@pytest.mark.skipif(os.geteuid() != 0, reason="remounting needs root")
def test_favor_dynmods_leaves_the_option_on_this_hosts_v2_mount():
    text = Path("/proc/self/mountinfo").read_text()
    if not [m for m in cgroups.parse_mountinfo(text) if m.version == 2]:
        pytest.skip("no cgroup v2 mount on this host")
    result = cgroups.favor_dynmods()
    (v2, *_) = [m for m in cgroups.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
                if m.version == 2]  # fmt: skip
    assert "favordynmods" in v2.options, result


def test_detect_returns_none_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    cgroups.detect.cache_clear()
    try:
        assert cgroups.detect() is None
    finally:
        monkeypatch.undo()
        cgroups.detect.cache_clear()


def test_an_unprivileged_process_gets_none_from_detect_and_a_clear_error_from_create(hierarchy):
    """As nobody for real (a forked child: nobody cannot read this root-owned virtualenv)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        report = "child failed"
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            cgroups.detect.cache_clear()
            report = f"detect={cgroups.detect()!r}"
            try:
                AttemptCgroup.create(hierarchy, f"gpuplatform-cgtest-{os.getpid()}-nobody")
                report += " create=succeeded"
            except CgroupError as exc:
                report += f" create=CgroupError({exc})"
        finally:
            os.write(write, report.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    assert report.startswith("detect=None create=CgroupError(cannot create"), report
    assert "Permission denied" in report


# --- tracking and killing ---------------------------------------------------------------------


def test_it_tracks_and_kills_a_setsid_grandchild_of_a_task_that_dropped_to_nobody(made):
    group = made.create("t1-a1")

    def join_then_drop():
        group.join_current_process()
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    proc = made.start(["sh", "-c", SETSID], group, preexec=join_then_drop)

    def both_sleeps():
        """the task and its setsid sleep to be in the cgroup"""
        found = [psutil.Process(pid) for pid in group.pids()]
        return found if len([p for p in found if p.name() == "sleep"]) == 2 else None

    members = wait_for(both_sleeps)
    assert {p.uids().real for p in members} == {NOBODY}, "joined first, then dropped root"
    assert any(os.getsid(p.pid) != proc.pid for p in members), "one left the task's session"
    assert not group.is_empty()

    assert group.kill() is True
    proc.wait(timeout=5)
    assert all(gone(p.pid) for p in members)
    assert group.is_empty() and group.pids() == []

    assert group.remove() is True
    assert not any(d.exists() for d in group.directories)


def test_it_tracks_and_kills_a_double_forked_daemon(made, tmp_path):
    group = made.create("t2-a1")
    pidfile = tmp_path / "daemon.pid"
    proc = made.start([sys.executable, "-c", DAEMON, str(pidfile)], group)
    assert proc.wait(timeout=10) == 0, "the daemon's first parent exits at once"
    daemon = int(wait_for(lambda: pidfile.exists() and pidfile.read_text()))
    assert psutil.Process(daemon).ppid() != os.getpid()
    assert daemon in group.pids()

    assert group.kill() is True
    wait_for(lambda: gone(daemon), timeout=5)
    assert group.remove() is True


def test_freeze_stops_every_process_and_thaw_lets_them_run_again(made, tmp_path):
    group = made.create("t3-a1")
    counter = tmp_path / "count"
    made.start([sys.executable, "-c", COUNTER, str(counter)], group)
    child = Path(f"{counter}.child")
    wait_for(lambda: read_int(counter) > 3 and read_int(child) > 3)

    group.freeze()
    assert group.is_frozen()
    if group.hierarchy.unified is not None:
        assert "frozen 1" in (group.path / "cgroup.events").read_text()
    else:
        assert (group.path / "freezer.state").read_text().strip() == "FROZEN"
    before = (read_int(counter), read_int(child))
    time.sleep(0.3)
    assert (read_int(counter), read_int(child)) == before, "nothing counts while frozen"
    assert len(group.pids()) == 2

    group.thaw()
    assert not group.is_frozen()
    wait_for(lambda: read_int(counter) > before[0] + 3 and read_int(child) > before[1] + 3)
    assert group.kill() is True


def test_a_frozen_attempt_can_be_killed(made):
    group = made.create("t4-a1")
    proc = made.start(["sh", "-c", SETSID], group)
    wait_for(lambda: len(group.pids()) >= 2)
    members = group.pids()
    group.freeze()

    assert group.kill(timeout=5) is True
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert all(gone(pid) for pid in members)
    assert group.remove() is True


def test_it_kills_a_task_that_keeps_forking(made):
    """Every process forks as fast as it can (bounded by a pids limit, for the host's sake):
    none may escape the kill by being born while it runs."""
    group = made.create("t12-a1", limits=Limits(pids=32))
    made.start([sys.executable, "-c", FORK_BOMB], group)
    wait_for(lambda: len(group.pids()) >= 24)
    assert group.kill() is True
    assert group.pids() == []
    assert group.remove() is True


def test_removing_a_parent_kills_and_removes_every_attempt_below_it(made):
    first, second = made.create("t13-a1"), made.create("t13-a2")
    for group in (first, second):
        made.start(["sh", "-c", SETSID], group)
    members = wait_for(lambda: len(first.pids()) >= 2 and len(second.pids()) >= 2 and first.pids())
    members += second.pids()
    parent = AttemptCgroup.find(made.hierarchy, made.top)
    assert parent is not None and set(members) <= set(parent.pids())

    assert parent.remove() is True
    assert all(gone(pid) for pid in members)
    assert AttemptCgroup.find(made.hierarchy, made.top) is None


def test_signal_reaches_every_process(made):
    group = made.create("t5-a1")
    proc = made.start(["sh", "-c", SETSID], group)
    members = wait_for(lambda: len(group.pids()) >= 2 and group.pids())
    group.signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == -signal.SIGTERM
    wait_for(lambda: all(gone(pid) for pid in members))
    assert group.is_empty()


# --- limits -----------------------------------------------------------------------------------


def test_a_task_over_its_memory_limit_is_oom_killed_and_counted(host):
    group = host.create("t6-a1", limits=Limits(memory_bytes=64 << 20))
    assert group.oom_kills() == 0
    proc = host.start(
        [sys.executable, "-c", "b = bytearray(256 << 20); import time; time.sleep(5)"], group
    )
    assert proc.wait(timeout=20) == -signal.SIGKILL
    assert group.oom_kills() >= 1


def test_a_pids_limit_of_five_stops_a_fork_loop(host, tmp_path):
    group = host.create("t7-a1", limits=Limits(pids=5))
    result = tmp_path / "forks"
    proc = host.start([sys.executable, "-c", FORKS, str(result)], group)
    assert proc.wait(timeout=10) == 0
    made, failed = map(int, result.read_text().split())
    assert made == 4, "the loop itself is the fifth"
    assert failed == 6
    assert len(group.pids()) == 4
    assert group.kill() is True


def test_a_cpu_limit_of_a_fifth_writes_the_quota(host):
    group = host.create("t8-a1", limits=Limits(cpus=0.2))
    directory = host.hierarchy.location("cpu").joinpath(*group.parts)
    if host.hierarchy.location("cpu") == host.hierarchy.unified:
        assert (directory / "cpu.max").read_text().split() == ["20000", "100000"]
    else:
        assert int((directory / "cpu.cfs_quota_us").read_text()) == 20000
        assert int((directory / "cpu.cfs_period_us").read_text()) == 100000


def test_a_limit_without_its_controller_is_refused_before_anything_is_made(host):
    without_memory = dataclasses.replace(
        host.hierarchy,
        unified_controllers=tuple(c for c in host.hierarchy.unified_controllers if c != "memory"),
        v1=tuple((c, base) for c, base in host.hierarchy.v1 if c != "memory"),
    )
    with pytest.raises(CgroupError, match="cannot enforce the memory limit"):
        AttemptCgroup.create(without_memory, host.top, "t9-a1", limits=Limits(memory_bytes=1 << 30))
    assert cgroups.list_children(host.hierarchy, host.top) == []


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="memory_bytes"):
        Limits(memory_bytes=0)
    with pytest.raises(ValueError, match="cpus"):
        Limits(cpus=0.001)
    with pytest.raises(ValueError, match="pids"):
        Limits(pids=0)


# --- finding and sweeping ---------------------------------------------------------------------


def test_list_children_shows_what_create_made_and_find_forgets_a_removed_one(host):
    first = host.create("t10-a1")
    again = host.create("t10-a1")  # idempotent
    host.create("t11-a1", limits=Limits(pids=10))
    assert again.directories == first.directories
    assert cgroups.list_children(host.hierarchy, host.top, "node-1") == ["t10-a1", "t11-a1"]
    assert cgroups.list_children(host.hierarchy, host.top, "no-such-node") == []

    found = AttemptCgroup.find(host.hierarchy, host.top, "node-1", "t10-a1")
    assert found is not None and found.directories == first.directories
    assert found.remove() is True
    assert found.remove() is True, "removing what is gone is fine"
    assert AttemptCgroup.find(host.hierarchy, host.top, "node-1", "t10-a1") is None
    assert cgroups.list_children(host.hierarchy, host.top, "node-1") == ["t11-a1"]


def test_an_attempt_occupies_only_the_tracker_and_the_v1_hierarchies_its_limits_need(host):
    tracker = host.hierarchy.tracker()
    plain = host.create("t12-a1")
    assert plain.directories == (tracker / host.top / "node-1" / "t12-a1",)
    assert plain.oom_kills() == 0, "no memory cgroup: nothing to count"
    v1 = dict(host.hierarchy.v1)
    if "pids" not in v1:
        pytest.skip("pids is a v2 controller here: no v1 directory to make or leave out")
    limited = host.create("t13-a1", limits=Limits(pids=10))
    expected = [base / host.top / "node-1" / "t13-a1" for base in (tracker, v1["pids"])]
    assert list(limited.directories) == expected and all(d.is_dir() for d in expected)
    others = [base for name, base in host.hierarchy.v1 if name != "pids"]
    assert not any((base / host.top / "node-1" / "t13-a1").exists() for base in others)
    proc = host.start(["sleep", "30"], limited)
    assert cgroups._procs(expected[1]) == {proc.pid}, "it joined the pids cgroup too"

    found = AttemptCgroup.find(host.hierarchy, host.top, "node-1", "t13-a1")
    assert found is not None and found.directories == limited.directories
    assert found.remove() is True and proc.wait(timeout=5) == -signal.SIGKILL
    assert not any(d.exists() for d in expected)


def test_it_refuses_names_that_are_not_one_directory(hierarchy):
    for parts in [(), ("a/b",), ("..",), ("",), ("ok", ".hidden")]:
        with pytest.raises(CgroupError):
            AttemptCgroup(hierarchy, *parts)
