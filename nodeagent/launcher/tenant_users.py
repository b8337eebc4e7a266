"""The Unix users the platform made for tenants on this host, found and removed.

A user is the platform's when both say so: its GECOS field is the mark ``useradd`` was given
(``identity.MARK`` + tenant name) and its name is the one the platform makes for that tenant
under the prefix asked for (``TENANT_USER_PREFIX`` by default). Any other user of the host (an
operator's ``unix_user`` included) is never listed, so never removed. Removal is ``userdel``:
it takes the user's own group with it; the tenant's root (its home) is left, being the tenant's
data. Test runs and benchmarks make their users under a prefix of their own and remove exactly
those when they finish.
"""

from __future__ import annotations

import pwd
import subprocess
from dataclasses import dataclass

from nodeagent.launcher.identity import MARK, tenant_user_name

USERDEL = "/usr/sbin/userdel"


@dataclass(frozen=True)
class TenantUser:
    name: str
    tenant: str
    uid: int
    home: str


def made_users(prefix: str) -> list[TenantUser]:
    """The users the platform made here under ``prefix``, by name."""
    found = []
    for entry in pwd.getpwall():
        if not entry.pw_gecos.startswith(MARK) or entry.pw_uid == 0:
            continue
        tenant = entry.pw_gecos[len(MARK) :]
        if tenant and entry.pw_name == tenant_user_name(tenant, prefix):
            found.append(TenantUser(entry.pw_name, tenant, entry.pw_uid, entry.pw_dir))
    return sorted(found, key=lambda user: user.name)


def orphans(users: list[TenantUser], tenants: frozenset[str], in_use: frozenset[str]):
    """Those of ``users`` whose tenant no longer exists and that no tenant names as its
    ``unix_user`` (``in_use``)."""
    return [user for user in users if user.tenant not in tenants and user.name not in in_use]


def remove(user: TenantUser) -> str | None:
    """``userdel`` the user (and its group); None when done, else why not."""
    if pwd.getpwnam(user.name).pw_gecos != MARK + user.tenant:
        return "no longer the user the platform made"
    result = subprocess.run(  # noqa: S603 - fixed argv; a name read back from the user database
        [USERDEL, user.name],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    if result.returncode != 0:
        return result.stderr.strip() or f"userdel exited {result.returncode}"
    return None


def remove_all(prefix: str) -> list[str]:
    """Remove every user made here under ``prefix`` (a test run's or a benchmark's own);
    the problems, one line each."""
    problems = []
    for user in made_users(prefix):
        problem = remove(user)
        if problem is not None:
            problems.append(f"{user.name}: {problem}")
    return problems
