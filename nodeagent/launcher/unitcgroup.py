"""Supervisors out of the node agent's systemd unit, so that restarting the agent spares tasks.

systemd stops a service by killing every process of the unit's cgroup (the default
``KillMode=control-group``); a double fork re-parents a supervisor to init, but a cgroup is kept
across forks, so every supervisor, and with it its task, would die with ``systemctl restart
gpuplatform-agent``. ``KillMode=process`` would spare them, at the price of leaving the
agent's spawner behind after a stop (systemd advises against it). Instead
the unit keeps the default, and each supervisor, once forked, moves itself into
``<CGROUP_NAME>/<node>/supervisors``, a leaf beside its node's attempt cgroups (``tracking``),
which already live outside the unit: in the cgroup v2 hierarchy and, on a hybrid or v1 host,
in systemd's own ``name=systemd`` hierarchy, the two that systemd's kill walks. The agent and its
spawner stay in the unit and stop with it; supervisors and tasks are
adopted by the next agent.

Only under systemd (``INVOCATION_ID`` set and the process in a ``*.service`` cgroup), only as
root, and only where those hierarchies can be written at their root; elsewhere nothing moves
(``make run`` keeps the process tree). No Django: the caller passes the cgroup name.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from nodeagent.launcher.cgroups import parse_mountinfo, parse_proc_cgroup

logger = logging.getLogger(__name__)

LEAF = "supervisors"  # never a task attempt's name (those are t<task>-a<attempt>)


def service_unit(proc_cgroup: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The systemd service this process runs in (``gpuplatform-agent.service``), or None.

    ``proc_cgroup`` is ``/proc/self/cgroup`` parsed (``cgroups.parse_proc_cgroup``). systemd
    sets ``INVOCATION_ID`` for the processes of a unit it starts; the cgroup tells a service
    from a login session's scope (``session-3.scope``), whose processes survive a stop anyway.
    """
    if not environ.get("INVOCATION_ID"):
        return None
    for key in ("", "name=systemd"):  # v2 (pure or hybrid), else v1's named hierarchy
        parts = [p for p in proc_cgroup.get(key, "").split("/") if p.endswith(".service")]
        if parts:
            return parts[-1]
    return None


def targets(mountinfo: str, cgroup_name: str, node_name: str) -> list[Path]:
    """The cgroup directories a supervisor joins to leave its unit: in the v2 hierarchy and in
    ``name=systemd``, each mounted at its own root (a container's bind of a subtree would
    keep the supervisor inside whatever holds the container, so it is not used)."""
    found: list[Path] = []
    for mount in parse_mountinfo(mountinfo):
        tracks_units = mount.version == 2 or "name=systemd" in mount.options
        if tracks_units and mount.root == "/":
            directory = mount.path / cgroup_name / node_name / LEAF
            if directory not in found:
                found.append(directory)
    return found


def prepare(
    cgroup_name: str,
    node_name: str,
    *,
    environ: Mapping[str, str] | None = None,
    proc: Path = Path("/proc/self"),
) -> tuple[tuple[bytes, ...], str]:
    """Make the leaves if this process runs in a systemd service as root: their
    ``cgroup.procs`` files (for :func:`leave`), and one line for the log saying what was done.
    """
    environ = os.environ if environ is None else environ
    try:
        unit = service_unit(parse_proc_cgroup((proc / "cgroup").read_text()), environ)
        mountinfo = (proc / "mountinfo").read_text()
    except OSError as exc:
        return (), f"cannot read this process's cgroups: {exc.strerror}"
    if unit is None:
        return (), "not a systemd service: supervisors stay where they are forked"
    if os.geteuid() != 0:
        return (), f"in {unit} but not root: supervisors stop with the unit"
    files = []
    for directory in targets(mountinfo, cgroup_name, node_name):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return (), f"in {unit}; cannot create {directory}: {exc.strerror}"
        files.append(os.fsencode(directory / "cgroup.procs"))
    if not files:
        return (), f"in {unit}; no cgroup hierarchy writable at its root: supervisors stop with it"
    where = ", ".join(os.fsdecode(f).removesuffix("/cgroup.procs") for f in files)
    return tuple(files), f"in {unit}; supervisors move to {where}"


@functools.cache
def prepared(cgroup_name: str, node_name: str) -> tuple[tuple[bytes, ...], str]:
    """:func:`prepare` once per process: the spawner (or a launch worker) calls it before it
    forks, and its supervisors inherit the answer."""
    return prepare(cgroup_name, node_name)


def leave_unit(cgroup_name: str, node_name: str) -> None:
    """A supervisor out of the node agent's systemd unit, if it runs in one, so that
    restarting the agent leaves it and its task running."""
    files, _ = prepared(cgroup_name, node_name)
    try:
        leave(files)
    except OSError as exc:
        logger.warning("cannot leave the node agent's unit (%s): a restart of it stops this task",
                       exc)  # fmt: skip


def leave(files: tuple[bytes, ...]) -> None:
    """Move the calling process into the prepared leaves (v2 first). Raises OSError."""
    for path in files:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
