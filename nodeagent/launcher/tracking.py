"""Every process of one attempt, as one thing to stop, pause and prove gone.

With cgroups (the node agent runs as root), each attempt gets its own cgroup,
``<CGROUP_NAME>/<node>/t<task>-a<attempt>``: a process cannot leave it by daemonizing, a stop
kills the cgroup, a pause freezes it, and the node agent can kill an attempt whose supervisor
died without knowing a single pid (systemd's ``KillMode=control-group``, Slurm's
proctrack/cgroup). Without cgroups (an unprivileged run), the supervisor's process tree is the
attempt: it is a child subreaper, so orphaned descendants stay its own; an attempt whose
supervisor died is then found by its session and by the marker in its environment.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence

import psutil
from django.conf import settings

from nodeagent.launcher import cgroups, gpufence, identity, namespaces, procs

logger = logging.getLogger(__name__)

TERM_POLL_S = 0.05


def cgroup_parts(node_name: str, task_id: int, attempt_no: int) -> tuple[str, ...]:
    return (settings.CGROUP_NAME, node_name, attempt_cgroup_name(task_id, attempt_no))


def attempt_cgroup_name(task_id: int, attempt_no: int) -> str:
    return f"t{task_id}-a{attempt_no}"


def parse_cgroup_name(name: str) -> tuple[int, int] | None:
    task, _, attempt = name.partition("-a")
    if not (task.startswith("t") and task[1:].isdigit() and attempt.isdigit()):
        return None
    return int(task[1:]), int(attempt)


def hierarchy() -> cgroups.Hierarchy | None:
    """The cgroups this node uses for attempts, or None (subreaper tracking)."""
    if not settings.USE_CGROUPS:
        return None
    return cgroups.detect()


def describe() -> str:
    """For the node's status: how this node keeps track of an attempt's processes."""
    found = hierarchy()
    if found is None:
        return "process tree (subreaper); no cgroups"
    return found.describe()


def isolation() -> str:
    """For the node's status: how tenants are separated here, GPUs (``gpufence``) and what
    tasks see of the host (``namespaces``) included."""
    how = identity.isolation_mode()
    if not identity.privileged():
        return how  # single-user mode says all there is to say
    return f"{how}; {gpufence.describe(hierarchy())}; {namespaces.describe()}"[:200]


class CgroupTracker:
    def __init__(self, group: cgroups.AttemptCgroup) -> None:
        self.group = group

    def join(self) -> None:
        """In the task's process, before it drops root's rights."""
        self.group.join_current_process()

    @property
    def procs_files(self) -> tuple[bytes, ...]:
        """What the task's process writes itself into (``join``), for the exec helper."""
        return self.group.procs_files

    def stop(self, grace_s: float, *, keep: int | None = None) -> bool:
        """SIGTERM everything, wait up to ``grace_s``, then kill the cgroup. True once empty."""
        if self.group.is_empty():
            return True  # the common end: the command exited and left nothing behind
        self.group.thaw()  # a frozen process cannot act on SIGTERM
        self.group.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not self.group.is_empty():
            time.sleep(TERM_POLL_S)
            procs.reap(keep=keep)
        gone = self.group.kill()
        procs.reap(keep=keep)
        return gone

    def pause(self) -> None:
        self.group.freeze()

    def resume(self) -> None:
        self.group.thaw()

    def oom_kills(self) -> int:
        return self.group.oom_kills()

    def pids_refused(self) -> int:
        return self.group.pids_refused()

    def cpu_throttling(self) -> tuple[int, int]:
        return self.group.cpu_throttling()

    def close(self) -> None:
        if not self.group.remove():
            logger.error("could not remove the cgroup of this attempt: processes remain")


class TreeTracker:
    """The fallback: the supervisor's descendants (it is a child subreaper)."""

    procs_files: tuple[bytes, ...] = ()

    def join(self) -> None:
        pass

    def stop(self, grace_s: float, *, keep: int | None = None) -> bool:
        # The common end: the command exited, was collected, and left nothing behind. Known
        # from the kernel at once; ``kill_tree`` would read every process of the host (psutil
        # builds a map of all parents) two or three times per attempt, as a cgroup never has
        # to: that made a node without cgroups (USE_CGROUPS=0) slower, not faster.
        if not procs.has_children():
            return True
        procs.kill_tree(grace_s, keep=keep)
        return not [p for p in procs.descendants() if p.pid != keep and procs.running(p)]

    def pause(self) -> None:
        procs.signal_all(procs.descendants(), signal.SIGSTOP)

    def resume(self) -> None:
        procs.signal_all(procs.descendants(), signal.SIGCONT)

    def oom_kills(self) -> int:
        return 0

    def pids_refused(self) -> int:
        return 0

    def cpu_throttling(self) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None:
        pass


def for_attempt(
    node_name: str,
    task_id: int,
    attempt_no: int,
    limits: cgroups.Limits,
    gpu_uuids: Sequence[str] = (),
):
    """The tracker a supervisor uses for its attempt (creating the cgroup, fenced to the
    device nodes of ``gpu_uuids`` where the host can: see ``gpufence``)."""
    found = hierarchy()
    if found is None:
        return TreeTracker()
    parts = cgroup_parts(node_name, task_id, attempt_no)
    fence = gpufence.plan(found, node_name, gpu_uuids)
    rules = fence.device_rules() if fence is not None and fence.how == "devices" else None
    group = cgroups.AttemptCgroup.create(found, *parts, limits=limits, deny_devices=rules)
    if fence is not None:
        try:
            gpufence.attach(group, fence)
        except cgroups.CgroupError:
            group.remove()
            raise
    return CgroupTracker(group)


# --- From the node agent: an attempt whose supervisor is gone ---------------------------------


def kill_orphaned_attempt(
    node_name: str, task_id: int, attempt_no: int, pid: procs.ProcessId | None
) -> bool:
    """Kill whatever is left of an attempt whose supervisor died. True once nothing is left:
    only then may its GPUs be offered again."""
    found = hierarchy()
    if found is not None:
        group = cgroups.AttemptCgroup.find(found, *cgroup_parts(node_name, task_id, attempt_no))
        if group is None:
            return True
        if not group.kill():
            return False
        group.remove()
        return True
    return _kill_matching(_orphans(task_id, attempt_no, pid))


def _orphans(task_id: int, attempt_no: int, pid: procs.ProcessId | None) -> list[psutil.Process]:
    """Processes of the attempt: its main process's session, and any process whose environment
    carries the attempt's marker (a ``setsid`` daemon keeps its environment)."""
    marker = {"GPUPLATFORM_TASK_ID": str(task_id), "GPUPLATFORM_ATTEMPT": str(attempt_no)}
    session = pid.pid if pid is not None and pid.alive() else None
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            if session is not None and os.getsid(proc.pid) == session:
                found.append(proc)
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if all(env.get(name) == value for name, value in marker.items()):
            found.append(proc)
    return found


def _kill_matching(found: list[psutil.Process], timeout: float = 10.0) -> bool:
    procs.signal_all(found, signal.SIGKILL)
    return not procs.wait_stopped(found, timeout)
