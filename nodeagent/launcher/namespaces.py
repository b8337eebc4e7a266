"""Each task in PID and mount namespaces of its own: what it sees of the host.

Without them a task of one tenant saw every other tenant's command line (``ps -eo user,args``)
and shared the host's ``/tmp``, or had none it could write where ``/tmp`` is ``0755 root``. With
them (``TASK_NAMESPACES``, root, through the exec helper ``gpup-exec -n``), a task sees its own
processes alone under a ``/proc`` of its own, and gets a private ``/tmp`` and ``/dev/shm``
(tmpfs of at most ``TASK_TMP_SIZE``, and never more than its ``resources.memory``; ``TMPDIR`` is
``/tmp``), gone when the attempt ends. The attempt's cgroups are joined before the namespaces
are made, so stopping, pausing and accounting are as before; the helper's init passes signals on
to the command and its exit status back (see gpup_exec.c).

Only through the exec helper: the namespace's init must stay between the supervisor and the
command for the whole run, and doing that in Python (``os.unshare`` is 3.12+; ctypes otherwise)
would keep a copy of the supervisor's interpreter alive per task, in the very fork the helper
exists to avoid. Where the helper is not built, or the kernel refuses (not root, a container
without the capability), tasks run as before and the node's isolation says why.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from pathlib import Path

from django.conf import settings

from gpuplatform.units import parse_memory_mb
from nodeagent.launcher import identity

logger = logging.getLogger(__name__)

ENABLED = "own PID and mount namespaces (private /proc, /tmp, /dev/shm)"
PROBE_TMP_BYTES = 1 << 20
PROBE_TIMEOUT_S = 10


@functools.cache
def unavailable() -> str | None:
    """Why this node's tasks get no namespaces of their own, or None when they do (looked up
    once per process: the spawner does it before it forks supervisors)."""
    from nodeagent.launcher.supervisor import exec_helper

    if not settings.TASK_NAMESPACES:
        return "TASK_NAMESPACES is off"
    if not identity.privileged():
        return "the node agent is not root"
    helper = exec_helper()
    if helper is None:
        return "the exec helper (TASK_EXEC_HELPER) is not built: run make"
    return _probe(helper)


def _probe(helper: str) -> str | None:
    """Run ``/bin/true`` as a task would be, in namespaces of its own: the kernel's answer."""
    try:
        done = subprocess.run(  # noqa: S603 - our own helper, fixed arguments
            [helper, "-n", str(PROBE_TMP_BYTES), "-", "-", "/", "0", "/bin/true"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run the exec helper: {exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()
    reason = said[-1] if said else f"exit status {done.returncode}"
    if "bad cgroup count -" in reason:  # it took -n for the user, and so on
        return "the exec helper is older than namespaces: rebuild it (make)"
    return reason.removeprefix("gpuplatform: cannot prepare the task: ")


def enabled() -> bool:
    return unavailable() is None


def describe() -> str:
    """For the node's status."""
    why = unavailable()
    return ENABLED if why is None else f"no PID/mount namespaces: {why}"


def tmp_bytes(resources: dict) -> int:
    """The size of a task's private /tmp (and /dev/shm): ``TASK_TMP_SIZE``, at most its
    ``resources.memory`` (its pages count to the task's memory cgroup in any case)."""
    size = settings.TASK_TMP_SIZE
    if size.endswith("%"):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cap = total * int(size[:-1]) // 100
    else:
        cap = parse_memory_mb(size, field="TASK_TMP_SIZE") * 1024 * 1024
    memory = resources.get("memory")
    if memory is not None:
        cap = min(cap, parse_memory_mb(memory) * 1024 * 1024)
    return cap


def helper_options(resources: dict, tenant_root: Path) -> list[str]:
    """The exec helper's options for a task: none where namespaces are off. A tenant root
    under /tmp (a test run's, or a host configured so) is bound back over the private /tmp."""
    if not enabled():
        return []
    options = ["-n", str(tmp_bytes(resources))]
    if Path("/tmp") in tenant_root.parents:  # noqa: S108 - the path the private tmpfs covers
        options += ["-k", str(tenant_root)]
    return options
