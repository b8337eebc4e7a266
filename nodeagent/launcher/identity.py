"""Who a task runs as on its node, and the directories that wall tenants off from each other.

When the node's platform processes run as root (the production case), a task never runs as
root or as the platform's user: each tenant has its own Unix identity, the operator's choice
(``Tenant.unix_user``) or a system user the platform creates, named ``TENANT_USER_PREFIX`` +
tenant name (``gpu-vision-lab``; names longer than 32 characters are cut and end in a short
hash). Its home is the tenant's private root (``TASKS_ROOT/<tenant>``, mode 0700, owned by
that user); it has no login shell. The platform's own directories (``TASK_LOG_DIR``, the
runtime secrets) are root's alone; ``TASKS_ROOT`` may only be crossed, not listed.

Run as an ordinary user (a student's ``make run``), the platform cannot switch users: every
task runs as that user ("single-user mode: tenants are not isolated on this host").
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from scheduling import paths
from scheduling.agentapi.messages import SINGLE_USER_NOTE

logger = logging.getLogger(__name__)

MAX_USER_NAME = 32  # useradd's limit
NOLOGIN = "/usr/sbin/nologin"
USERADD = "/usr/sbin/useradd"
USERS_LOCK = "tenant-users.lock"  # in VAR_DIR: see _creating_users
# The GECOS field of every user the platform makes, then the tenant's name: how the platform
# knows its own users from the host's (nodeagent.launcher.tenant_users).
MARK = "gpuplatform tenant "


class IdentityError(Exception):
    """The tenant's identity cannot be used on this node; the message says why."""


@dataclass(frozen=True)
class Identity:
    user: str
    uid: int
    gid: int
    home: Path


def privileged() -> bool:
    return os.geteuid() == 0


def isolation_mode() -> str:
    """What the node reports in its status: how tenants are separated on this host."""
    return "tenant users" if privileged() else SINGLE_USER_NOTE


def tenant_user_name(tenant_name: str, prefix: str | None = None) -> str:
    """The Unix user the platform creates for a tenant that has no ``unix_user`` set
    (``prefix``: TENANT_USER_PREFIX unless given)."""
    name = (settings.TENANT_USER_PREFIX if prefix is None else prefix) + tenant_name
    if len(name) <= MAX_USER_NAME:
        return name
    digest = hashlib.sha256(tenant_name.encode()).hexdigest()[:6]
    return f"{name[: MAX_USER_NAME - 7].rstrip('-')}-{digest}"


def tenant_identity(tenant_name: str, unix_user: str) -> Identity | None:
    """The identity a tenant's tasks run as, with its private root ready; None in single-user
    mode, where tasks run as the platform's own user."""
    if not privileged():
        return None
    name = unix_user or tenant_user_name(tenant_name)
    root = paths.tenant_root(tenant_name)
    entry = _user(name, create=not unix_user, home=root, tenant_name=tenant_name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise IdentityError(
            f"unix_user {name!r} is root or in group root: tasks never run with root's rights"
        )
    _private_root(root, entry.pw_uid, entry.pw_gid)
    return Identity(user=name, uid=entry.pw_uid, gid=entry.pw_gid, home=root)


def _user(name: str, *, create: bool, home: Path, tenant_name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        if not create:
            raise IdentityError(f"unix_user {name!r} does not exist on this node") from None
    with _creating_users():
        try:
            return pwd.getpwnam(name)  # another launch on this host created it meanwhile
        except KeyError:
            result = _useradd(name, home=home, tenant_name=tenant_name)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise IdentityError(
                f"cannot create the Unix user {name!r}: "
                f"{result.stderr.strip() or result.returncode}"
            ) from None
    logger.info("created Unix user %s (uid %s) for tenant %s", name, entry.pw_uid, tenant_name)
    return entry


@contextmanager
def _creating_users() -> Iterator[None]:
    """Held by whoever creates a tenant's user on this host, the launches of every node agent
    here included. useradd does not serialise itself: 16 concurrent calls for one new name all
    exit 0, and their callers read two different uids back (Debian 12, shadow 4.13). The last
    write wins, so a task could run as a uid its name no longer has, in a root chowned to it,
    and the next user created could be given that uid. The lock file lives in the platform's
    VAR_DIR, where no task can open it (and hold the lock)."""
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(
        settings.VAR_DIR / USERS_LOCK,
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _useradd(name: str, *, home: Path, tenant_name: str) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 - fixed argv; the name is a validated tenant slug
        [
            USERADD,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            NOLOGIN,
            "--comment",
            f"{MARK}{tenant_name}",
            name,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def _private_root(root: Path, uid: int, gid: int) -> None:
    """``TASKS_ROOT/<tenant>``: 0700 and the tenant's own. Only the directory itself changes
    hands; what the tenant keeps inside is its business.

    Plain ``os`` calls on strings: every task's supervisor runs this, and pathlib's objects
    cost more."""
    tasks_root = os.path.dirname(root)
    os.makedirs(tasks_root, exist_ok=True)
    _reachable(tasks_root)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode):
        raise IdentityError(f"{root} is a symbolic link; a tenant root must be a directory")
    if not stat.S_ISDIR(info.st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(root))
    if (info.st_uid, info.st_gid) != (uid, gid):
        os.chown(root, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(root, 0o700)


def _reachable(tasks_root: str) -> None:
    """Tenant users must be able to pass through every directory above their roots."""
    directory = tasks_root
    while directory:
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            raise IdentityError(
                f"{directory} is closed to other users (no o+x), so tenant users cannot reach "
                f"their directories under {tasks_root}: run `chmod o+x {directory}` or set "
                "GPUPLATFORM_TASKS_ROOT elsewhere"
            )
        parent = os.path.dirname(directory)
        directory = parent if parent != directory else ""


def secure_platform_dirs() -> None:
    """At agent start: logs and runtime files are root's alone, ``TASKS_ROOT`` can be crossed
    but not listed, and ``var/`` shows other users nothing they could read."""
    if not privileged():
        return
    for directory, mode in (
        (Path(settings.TASK_LOG_DIR), 0o700),
        (runtime_dir(), 0o700),
        (Path(settings.TASKS_ROOT), 0o711),
    ):
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, mode)
    var = Path(settings.VAR_DIR)
    if var.is_dir():
        os.chmod(var, 0o711)  # noqa: S103 - crossing only: listing and reading stay closed
    examples_dir()  # published before the first task asks for it


def examples_dir() -> str:
    """Where tasks find the shipped examples (``$GPUPLATFORM_EXAMPLES``): the checkout's own,
    or, where tenant users cannot reach the checkout (``EXAMPLES_DIR`` set elsewhere, see
    settings), a copy there that every user may read, refreshed when the checkout's changes."""
    target = str(settings.EXAMPLES_DIR)
    source = os.path.join(settings.BASE_DIR, "examples")
    if target != source and privileged():
        _publish_examples(source, target)
    return target


_EXAMPLES_STAMP = ".gpuplatform-copied"


def _publish_examples(source: str, target: str) -> None:
    """Copy ``source`` to ``target`` unless the copy is current (its stamp names the newest
    change of the source), under the lock of the node's supervisors: two first tasks at once
    must not read a half-written file."""
    files = [os.path.join(d, f) for d, _, names in os.walk(source) for f in names]
    stamp = str(max((os.stat(f).st_mtime_ns for f in files), default=0))
    stamp_path = os.path.join(target, _EXAMPLES_STAMP)
    with _creating_users():
        try:
            with open(stamp_path) as handle:
                if handle.read() == stamp:
                    return
        except FileNotFoundError:
            pass
        parent = os.path.dirname(target)
        os.makedirs(parent, mode=0o711, exist_ok=True)
        os.chmod(parent, 0o711)  # noqa: S103 - crossing only, to the examples
        shutil.copytree(source, target, dirs_exist_ok=True)
        for directory, _, names in os.walk(target):
            os.chmod(directory, 0o755)  # noqa: S103 - the examples are public
            for name in names:
                path = os.path.join(directory, name)
                os.chmod(path, 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644)  # noqa: S103
        with open(stamp_path, "w") as handle:
            handle.write(stamp)


def runtime_dir() -> Path:
    """Where the node keeps what its processes must read and tasks must not (0700)."""
    return Path(settings.VAR_DIR) / "run"


def drop_privileges(identity: Identity) -> None:
    """In the task's process, before exec: become the tenant's user for good."""
    os.setgroups([])
    os.setgid(identity.gid)
    os.setuid(identity.uid)
