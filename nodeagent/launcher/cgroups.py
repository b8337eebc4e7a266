"""One cgroup per task attempt: track, freeze, kill and limit every process of the attempt.

Process groups and sessions are chosen by the task itself (``setsid``, a double-forking daemon),
and a subreaper only sees orphans while it lives. A cgroup is assigned by the kernel at fork and
cannot be left by an unprivileged process, so it is the one complete answer to "which processes
belong to this attempt" (systemd and Slurm rely on it for the same reason).

Hosts differ, so nothing here assumes a path:

* pure cgroup v2 (``/sys/fs/cgroup`` is ``cgroup2``): one directory per attempt; ``cgroup.kill``
  (kernel >= 5.14) kills it whole, ``cgroup.freeze`` pauses it, controllers (memory, pids, cpu)
  are enabled top-down through ``cgroup.subtree_control`` of the platform's own parents, which
  hold no processes (the "no internal processes" rule);
* hybrid (v1 controllers plus a controller-less ``cgroup2`` at ``/sys/fs/cgroup/unified``): v2
  tracks, freezes and kills; the limits live in the v1 memory, pids and cpu hierarchies;
* pure v1: the freezer hierarchy tracks and makes killing race-free; v1 controllers limit.

Mounts come from ``/proc/self/mountinfo``. Each hierarchy's platform cgroups live below its mount
root when that is writable (verified by creating and removing a probe), else below this
process's own cgroup there. Callers without cgroups (not root, read-only mounts) get ``None``
from :func:`detect` and keep tracking processes as a subreaper.

No Django here: the supervisor calls :meth:`AttemptCgroup.join_current_process` between fork and
exec, and the node agent sweeps attempts without the ORM.
"""

from __future__ import annotations

import errno
import functools
import os
import signal as signals
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Controllers the platform limits and accounts with; the order is the one reports use.
LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
# v1 only (v2 has eBPF device programs instead, see gpufence): which devices an attempt opens.
DEVICES = "devices"
CPU_PERIOD_US = 100_000
# A freeze normally completes in microseconds; a task stuck in uninterruptible sleep (a dead
# NFS server, a wedged GPU driver call) can hold it up, and then the caller must hear about it.
FREEZE_TIMEOUT = 5.0


class CgroupError(Exception):
    """A cgroup operation this host cannot do (missing controller, no permission, stuck freeze)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one attempt; ``None`` leaves that resource unlimited.

    ``cpus`` is a bandwidth share (0.5 = half of one CPU per 100 ms period), not a CPU set.
    """

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive, not {self.memory_bytes}")
        if self.cpus is not None and not self.cpus * CPU_PERIOD_US >= 1000:
            # The kernel refuses quotas under 1 ms per period.
            raise ValueError(f"cpus must be at least 0.01, not {self.cpus}")
        if self.pids is not None and self.pids < 1:
            raise ValueError(f"pids must be at least 1, not {self.pids}")

    def controllers(self) -> list[str]:
        """The controllers these limits need."""
        wanted = {"memory": self.memory_bytes, "pids": self.pids, "cpu": self.cpus}
        return [name for name in LIMIT_CONTROLLERS if wanted[name] is not None]


@dataclass(frozen=True)
class Hierarchy:
    """What this host offers, as base directories under which the platform's cgroups live.

    ``unified`` is the v2 base when v2 tracks the attempts (it can freeze them); then
    ``unified_controllers`` are the limit controllers enabled below it and ``unified_kill`` says
    whether ``cgroup.kill`` exists. Otherwise the v1 ``freezer`` base tracks them. ``v1`` maps
    each limit controller the v2 side lacks, and ``devices``, to its v1 base (controllers
    sharing one v1 mount, such as ``cpu,cpuacct``, share the base).
    """

    unified: Path | None = None
    unified_controllers: tuple[str, ...] = ()
    unified_kill: bool = False
    freezer: Path | None = None
    v1: tuple[tuple[str, Path], ...] = ()

    def describe(self) -> str:
        """One line for the node's status, e.g. ``cgroup v2 (/sys/fs/cgroup) with memory, cpu``."""
        if self.unified is not None:
            text = f"cgroup v2 ({self.unified})"
            if self.unified_controllers:
                text += " with " + ", ".join(self.unified_controllers)
            if not self.unified_kill:
                text += ", no cgroup.kill (kills by freezing)"
        else:
            text = f"cgroup v1 freezer ({self.freezer})"
        if self.v1:
            text += " + v1 " + ", ".join(name for name, _ in self.v1)
        return text

    def tracker(self) -> Path | None:
        """The base whose cgroups say which processes an attempt has."""
        return self.unified if self.unified is not None else self.freezer

    def location(self, controller: str) -> Path | None:
        """The base directory holding ``controller`` (v2 or v1), or None when it is missing."""
        if controller in self.unified_controllers:
            return self.unified
        for name, base in self.v1:
            if name == controller:
                return base
        return None

    def bases(self, controllers: Iterable[str] | None = None) -> list[Path]:
        """The base directories an attempt occupies, the tracker first, each once: with
        ``controllers``, the v1 bases of those only (an attempt without limits needs none)."""
        found: list[Path] = []
        wanted = [base for name, base in self.v1 if controllers is None or name in controllers]
        for base in [self.tracker(), *wanted]:
            if base is not None and base not in found:
                found.append(base)
        return found


# --- detection --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    path: Path
    root: str  # the hierarchy path mounted there ("/" unless a subtree is bind-mounted)
    version: int
    options: frozenset[str]  # super options (v1: they name its controllers)
    mount_options: frozenset[str] = frozenset()  # per mount point (nosuid, relatime, ...)
    source: str = ""


def _unescape(field: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash in paths as ``\040`` etc."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and chunk.isdigit():
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup mounts in a ``/proc/<pid>/mountinfo`` text, in mount order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or len(fields) < 5:
            continue
        fstype, super_options = fields[sep + 1], fields[sep + 3]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(
                path=Path(_unescape(fields[4])),
                root=_unescape(fields[3]),
                version=2 if fstype == "cgroup2" else 1,
                options=frozenset(super_options.split(",")),
                mount_options=frozenset(fields[5].split(",")),
                source=_unescape(fields[sep + 2]),
            )
        )
    return mounts


# mount(2) flags for the per-mount-point options a remount must repeat (or it clears them).
_MOUNT_FLAGS = {
    "ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
    "relatime": 1 << 21, "strictatime": 1 << 24,
}  # fmt: skip
MS_REMOUNT = 32


def favor_dynmods_mount(mountinfo: str) -> tuple[str, str, str, int, str] | None:
    """The ``mount(2)`` arguments that turn on ``favordynmods`` for the cgroup v2 mount in a
    mountinfo text, keeping its other options; None when there is no v2 mount or it is on.

    Every task attempt gets a new cgroup and its first process moves into it. By default the
    kernel makes such a move wait for an RCU grace period whenever none happened for a while;
    ``favordynmods`` "reduce[s] the latencies of dynamic cgroup modifications such as task
    migrations ... at the cost of making hot path operations such as forks and exits more
    expensive" (Documentation/admin-guide/cgroup-v2.rst), the trade a node that starts tasks
    all day wants."""
    mount = next((m for m in parse_mountinfo(mountinfo) if m.version == 2), None)
    if mount is None or "favordynmods" in mount.options:
        return None
    flags = MS_REMOUNT
    for option in mount.mount_options:
        flags |= _MOUNT_FLAGS.get(option, 0)
    data = ",".join([*sorted(mount.options - {"rw", "ro"}), "favordynmods"])
    return mount.source, str(mount.path), "cgroup2", flags, data


def favor_dynmods() -> str:
    """Turn on ``favordynmods`` for this host's cgroup v2 mount (root only); what was done."""
    import ctypes

    from nodeagent.launcher import procs

    try:
        arguments = favor_dynmods_mount(Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return f"cannot read the mounts: {exc.strerror}"
    if arguments is None:
        return "already on (or no cgroup v2 mount)"
    source, target, fstype, flags, data = arguments
    done = procs.libc().mount(
        source.encode(), target.encode(), fstype.encode(), flags, data.encode()
    )
    if done != 0:
        return f"cannot remount {target}: {os.strerror(ctypes.get_errno())}"
    return f"turned on for {target}"


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as {controller: path}; the v2 path is under the key ``""``."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _own_cgroup(mount: _Mount, current: str | None) -> Path | None:
    """This process's cgroup in ``mount`` as a directory, when it is visible under the mount."""
    if current is None:
        return None
    root = mount.root.rstrip("/")
    if current != root and not current.startswith(root + "/"):
        return None
    relative = current[len(root) :].strip("/")
    return mount.path / relative if relative else None


def _probe(base: Path) -> frozenset[str] | None:
    """Whether cgroups can be created under ``base``: the files a new one gets, or None."""
    probe = base / f"gpuplatform-probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        probe.mkdir()
    except OSError:
        return None
    try:
        return frozenset(os.listdir(probe))
    except OSError:
        return None
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def _writable_base(mount: _Mount, current: str | None) -> tuple[Path, frozenset[str]] | None:
    """The mount root if cgroups can be made there, else this process's own cgroup."""
    for base in (mount.path, _own_cgroup(mount, current)):
        if base is None:
            continue
        files = _probe(base)
        if files is not None:
            return base, files
    return None


def _enable(directory: Path, controllers: list[str]) -> list[str]:
    """Enable ``controllers`` for the children of ``directory``; return those now enabled."""
    if controllers:
        try:
            _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
        except CgroupError:
            pass  # some may already be on, others refused: what matters is what is on now
    return [c for c in controllers if c in _read(directory / "cgroup.subtree_control").split()]


@functools.cache
def detect() -> Hierarchy | None:
    """What this host offers, or None when cgroups cannot be used (then track as a subreaper).

    Cached per process; ``detect.cache_clear()`` makes the next call look afresh (tests).
    """
    if os.geteuid() != 0:
        return None
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        current = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None

    unified = None
    unified_controllers: list[str] = []
    unified_kill = False
    for mount in [m for m in mounts if m.version == 2][:1]:
        found = _writable_base(mount, current.get(""))
        if found is None or "cgroup.freeze" not in found[1]:
            continue  # a v2 without freeze (kernel < 5.2) cannot stop a forking task
        unified, files = found
        unified_kill = "cgroup.kill" in files
        try:
            offered = _read(unified / "cgroup.controllers").split()
            wanted = [c for c in LIMIT_CONTROLLERS if c in offered]
            # Below the root this fails when our own process sits in the base: then no limits.
            unified_controllers = _enable(unified, wanted)
        except CgroupError:
            unified_controllers = []

    v1_by_controller: dict[str, Path] = {}
    freezer = None
    for mount in (m for m in mounts if m.version == 1):
        needed = [
            c
            for c in (*LIMIT_CONTROLLERS, DEVICES, "freezer")
            if c in mount.options
            and c not in v1_by_controller
            and not (c == "freezer" and (freezer or unified))
            and c not in unified_controllers
        ]
        if not needed:
            continue
        own = next((current[c] for c in sorted(mount.options) if c in current), None)
        found = _writable_base(mount, own)
        if found is None:
            continue
        for c in needed:
            if c == "freezer":
                freezer = found[0]
            else:
                v1_by_controller[c] = found[0]

    if unified is None and freezer is None:
        return None
    v1 = tuple(
        (c, v1_by_controller[c]) for c in (*LIMIT_CONTROLLERS, DEVICES) if c in v1_by_controller
    )
    return Hierarchy(
        unified=unified,
        unified_controllers=tuple(unified_controllers),
        unified_kill=unified_kill,
        freezer=freezer if unified is None else None,
        v1=v1,
    )


# --- one attempt ------------------------------------------------------------------------------


def _check_parts(parts: tuple[str, ...]) -> None:
    """Each part is one directory name: no separators, no dot names, nothing hidden."""
    if not parts:
        raise CgroupError("a cgroup needs at least one name")
    for part in parts:
        if not part or "/" in part or "\0" in part or part.startswith("."):
            raise CgroupError(f"not a usable cgroup name: {part!r}")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CgroupError(f"cannot read {path}: {exc.strerror}") from exc


def _write(path: Path, text: str) -> None:
    """One write(2) of ``text``: cgroup files take a value per write and report errors there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise CgroupError(f"cannot write {text!r} to {path}: {exc.strerror}") from exc


def _keyed(path: Path, key: str) -> int | None:
    """The number after ``key`` in a flat-keyed file (cgroup.events, memory.events).

    One os.read: a supervisor reads ``cgroup.events`` at least twice per task, and a text file
    object costs more."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)  # a few short lines
        finally:
            os.close(fd)
    except OSError:
        return None
    prefix = key.encode() + b" "
    for line in data.splitlines():
        if line.startswith(prefix):
            return int(line[len(prefix) :])
    return None


def _subtree(directory: Path) -> Iterator[Path]:
    """``directory`` and every cgroup below it (a task may not make any, but root code may)."""
    yield directory
    for parent, names, _ in os.walk(directory):
        for name in names:
            yield Path(parent, name)


def _procs(directory: Path) -> set[int]:
    found: set[int] = set()
    for group in _subtree(directory):
        try:
            found.update(int(pid) for pid in (group / "cgroup.procs").read_text().split())
        except OSError:
            continue  # removed while we walked
    return found


def _rmdir_tree(directory: Path, deadline: float) -> bool:
    """Remove ``directory`` and its sub-cgroups, bottom up; True when it is gone."""
    try:
        # The common case, an attempt that made no sub-cgroups, without the walk: making and
        # removing a cgroup is on every attempt's path.
        os.rmdir(directory)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass  # sub-cgroups, or processes still leaving: as below
    groups = list(_subtree(directory))
    for group in reversed(groups):
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise CgroupError(f"cannot remove {group}: {exc.strerror}") from exc
                # Exiting tasks leave a cgroup a moment after they stop being listed.
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
    return not directory.exists()


def _pause(attempt: int) -> None:
    """Poll fast at first (the kernel usually finishes in microseconds), then back off."""
    time.sleep(min(0.001 * (2**attempt), 0.05))


class AttemptCgroup:
    """The cgroup directories of one task attempt, one per hierarchy the host uses.

    The instance only holds paths, so a node agent can :meth:`find` an attempt a dead
    supervisor left and kill or remove it.
    """

    def __init__(
        self, hierarchy: Hierarchy, *parts: str, controllers: Iterable[str] | None = None
    ) -> None:
        """``controllers``: the limit controllers the attempt uses; None for all the host has."""
        _check_parts(parts)
        self.hierarchy = hierarchy
        self.parts = parts
        self.directories = tuple(base.joinpath(*parts) for base in hierarchy.bases(controllers))
        # Precomputed so the child between fork and exec only calls open/write/close; also what
        # the supervisor hands its exec helper (``TASK_EXEC_HELPER``), v2 first.
        self.procs_files = tuple(os.fsencode(d / "cgroup.procs") for d in self.directories)

    def __repr__(self) -> str:
        return f"AttemptCgroup({'/'.join(self.parts)!r} in {self.hierarchy.describe()})"

    @property
    def path(self) -> Path:
        """The tracking directory (v2 when used): the one to show in logs."""
        return self.directories[0]

    def _dir(self, controller: str) -> Path | None:
        base = self.hierarchy.location(controller)
        directory = base.joinpath(*self.parts) if base is not None else None
        return directory if directory in self.directories else None

    @property
    def _unified(self) -> Path | None:
        return self.directories[0] if self.hierarchy.unified is not None else None

    @classmethod
    def create(
        cls,
        hierarchy: Hierarchy,
        *parts: str,
        limits: Limits = Limits(),
        deny_devices: list[str] | None = None,
    ) -> AttemptCgroup:
        """Make (or reuse) the attempt's directories in every hierarchy and apply ``limits``;
        with ``deny_devices`` (``devices.deny`` lines), join the v1 devices controller too.

        Raises CgroupError before creating anything when a limit has no controller here, since a
        task that believes it is limited and is not can take the node down.
        """
        controllers = limits.controllers() + ([DEVICES] if deny_devices is not None else [])
        missing = [c for c in controllers if hierarchy.location(c) is None]
        if missing:
            raise CgroupError(
                f"cannot enforce the {', '.join(missing)} limit: no such controller in "
                f"{hierarchy.describe()}"
            )
        # Only the tracker and the controllers the limits need: a v1 hierarchy joined for
        # nothing cost each attempt a mkdir, a join and an rmdir (three of four, here).
        group = cls(hierarchy, *parts, controllers=controllers)
        for base in hierarchy.bases(controllers):
            if base == hierarchy.unified:
                group._make_unified(base, limits)
            else:
                try:
                    base.joinpath(*parts).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CgroupError(
                        f"cannot create {base.joinpath(*parts)}: {exc.strerror}"
                    ) from exc
        group._apply(limits)
        for rule in deny_devices or ():
            _write(group._dir(DEVICES) / "devices.deny", rule)
        return group

    def _make_unified(self, base: Path, limits: Limits) -> None:
        """mkdir level by level, enabling the v2 controllers in each parent on the way down."""
        controllers = list(self.hierarchy.unified_controllers)
        if not controllers:  # nothing to enable: the parents only when they are missing
            try:
                base.joinpath(*self.parts).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot create {base.joinpath(*self.parts)}: {exc}") from exc
            return
        directory = base
        for part in self.parts:
            if controllers:
                enabled = _enable(directory, controllers)
                refused = [c for c in limits.controllers() if c in controllers and c not in enabled]
                if refused:
                    raise CgroupError(
                        f"cannot enable {', '.join(refused)} in {directory}/cgroup.subtree_control"
                        " (does it hold processes itself?)"
                    )
                controllers = enabled
            directory = directory / part
            try:
                directory.mkdir(exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot create {directory}: {exc.strerror}") from exc

    def _apply(self, limits: Limits) -> None:
        if limits.memory_bytes is not None:
            directory = self._dir("memory")
            name = "memory.max" if directory == self._unified else "memory.limit_in_bytes"
            _write(directory / name, str(limits.memory_bytes))
        if limits.pids is not None:
            _write(self._dir("pids") / "pids.max", str(limits.pids))
        if limits.cpus is not None:
            directory = self._dir("cpu")
            quota = int(limits.cpus * CPU_PERIOD_US)
            if directory == self._unified:
                _write(directory / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(directory / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(directory / "cpu.cfs_quota_us", str(quota))

    @classmethod
    def find(cls, hierarchy: Hierarchy, *parts: str) -> AttemptCgroup | None:
        """The attempt's cgroup if any of its directories exists (a half-made one included, so
        that it can be removed): the tracker and the v1 directories it has."""
        _check_parts(parts)
        used = [name for name, base in hierarchy.v1 if base.joinpath(*parts).is_dir()]
        group = cls(hierarchy, *parts, controllers=used)
        return group if any(d.is_dir() for d in group.directories) else None

    def join_current_process(self) -> None:
        """Move the calling process into the attempt (v2 first, so it is tracked from then on).

        Meant for ``preexec_fn``, between fork and exec: only open/write/close on precomputed
        paths. Join while still root, then drop privileges in the same function (subprocess's
        ``user=``/``group=`` are applied before ``preexec_fn``, too early). Raises OSError if a
        directory is gone, so the task fails to start rather than run untracked.
        """
        for path in self.procs_files:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def pids(self) -> list[int]:
        """Every process in the attempt. v2's list is authoritative; without v2, the union."""
        directories = self.directories[:1] if self._unified else self.directories
        found: set[int] = set()
        for directory in directories:
            found |= _procs(directory)
        return sorted(found)

    def is_empty(self) -> bool:
        """No process left (zombies waiting for their parent's wait() do not count)."""
        if self._unified is not None:
            populated = _keyed(self._unified / "cgroup.events", "populated")
            return not populated  # None: the directory is gone
        return not self.pids()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process (SIGTERM before the kill, SIGCONT, ...)."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def is_frozen(self) -> bool:
        """Whether the attempt is frozen (every process stopped by the kernel)."""
        if self._unified is not None:
            return _keyed(self._unified / "cgroup.events", "frozen") == 1
        state = self.directories[0] / "freezer.state"
        try:
            return state.read_text().strip() == "FROZEN"
        except OSError:
            return False

    def freeze(self, timeout: float = FREEZE_TIMEOUT) -> None:
        """Stop every process, without a signal the task could notice or handle (pause)."""
        self._set_frozen(True, timeout)

    def thaw(self, timeout: float = FREEZE_TIMEOUT) -> None:
        """Let a frozen attempt run again (resume)."""
        self._set_frozen(False, timeout)

    def _set_frozen(self, frozen: bool, timeout: float) -> None:
        if self._unified is not None:
            _write(self._unified / "cgroup.freeze", "1" if frozen else "0")
        else:
            _write(self.directories[0] / "freezer.state", "FROZEN" if frozen else "THAWED")
        deadline = time.monotonic() + timeout
        attempt = 0
        while self.is_frozen() != frozen:
            if time.monotonic() > deadline:
                verb = "freeze" if frozen else "thaw"
                raise CgroupError(f"{self.path} did not {verb} within {timeout} s")
            if self._unified is None and frozen:
                # v1 stays FREEZING after a failed pass until freezer.state is written again.
                _write(self.directories[0] / "freezer.state", "FROZEN")
            _pause(attempt)
            attempt += 1

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL every process; True once the attempt is proven empty within ``timeout``.

        v2 with ``cgroup.kill`` lets the kernel do it atomically. Otherwise the attempt is frozen
        first, so no process can fork between our reading the list and the signals arriving,
        then killed and thawed, until nothing is left. Frozen attempts are killed the same way.
        """
        deadline = time.monotonic() + timeout
        if self._unified is not None and self.hierarchy.unified_kill:
            try:
                _write(self._unified / "cgroup.kill", "1")
            except CgroupError:
                if self._unified.exists():
                    raise
                return True
            return self._wait_empty(deadline)
        while not self.is_empty():
            if time.monotonic() > deadline:
                return False
            try:
                self.freeze(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except CgroupError:
                pass  # a task in uninterruptible sleep: kill what can be killed, retry
            self.signal(signals.SIGKILL)
            try:
                self.thaw(timeout=max(0.1, deadline - time.monotonic()))
            except CgroupError:
                if any(d.exists() for d in self.directories):
                    raise
                return True
            self._wait_empty(min(deadline, time.monotonic() + 0.2))
        return True

    def _wait_empty(self, deadline: float) -> bool:
        attempt = 0
        while not self.is_empty():
            if time.monotonic() > deadline:
                return False
            _pause(attempt)
            attempt += 1
        return True

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the attempt's memory limit."""
        directory = self._dir("memory")
        if directory is None:
            return 0
        if directory == self._unified:
            return _keyed(directory / "memory.events", "oom_kill") or 0
        count = _keyed(directory / "memory.oom_control", "oom_kill")
        if count is None:  # kernels before 4.13: how often the limit was hit, at least
            try:
                count = int((directory / "memory.failcnt").read_text())
            except (OSError, ValueError):
                count = 0
        return count

    def pids_refused(self) -> int:
        """How many forks ``pids.max`` refused (the ``max`` count of ``pids.events``, v2 or v1)."""
        directory = self._dir("pids")
        return 0 if directory is None else _keyed(directory / "pids.events", "max") or 0

    def cpu_throttling(self) -> tuple[int, int]:
        """(periods, periods throttled) of the attempt's CPU quota, from ``cpu.stat``."""
        directory = self._dir("cpu")
        if directory is None:
            return 0, 0
        stat = directory / "cpu.stat"
        return _keyed(stat, "nr_periods") or 0, _keyed(stat, "nr_throttled") or 0

    def remove(self, timeout: float = 10.0) -> bool:
        """Kill what is left and remove every directory; True when all are gone.

        Never raises for directories already gone (a sweep and a supervisor may race).
        """
        deadline = time.monotonic() + timeout
        if not self.is_empty() and not self.kill(timeout):
            return False
        gone = True
        for directory in self.directories:
            gone = _rmdir_tree(directory, deadline) and gone
        return gone


def list_children(hierarchy: Hierarchy, *parts: str) -> list[str]:
    """Names of the cgroups directly under ``parts`` in any hierarchy (the node agent's sweep)."""
    _check_parts(parts)
    names: set[str] = set()
    for base in hierarchy.bases():
        try:
            with os.scandir(base.joinpath(*parts)) as entries:
                names.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            continue
    return sorted(names)
