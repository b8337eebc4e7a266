"""Node credentials: a PostgreSQL login role per node agent, a member of ``gpup_nodes``, whose
row-level security (migration 0029) keys on ``NodeCredential``. Made, rotated and revoked by
``manage.py node_credential``; the platform's own role must be allowed to create roles.

The password is random, shown once (in the URL the node's agent uses) and sent to the server
already hashed (SCRAM, as psql's ``\\password`` does), so it never reaches a server log.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from urllib.parse import quote

from django.db import ProgrammingError, connection, transaction
from django.utils import timezone
from psycopg import errors, sql

from gpuplatform.dburl import database_host, hosts_netloc, query
from scheduling.models import NodeCredential

GROUP = "gpup_nodes"
PREFIX = "gpup_node_"
MAX_ROLE = 63  # PostgreSQL cuts identifiers there


class CredentialError(Exception):
    pass


@dataclass(frozen=True)
class Issued:
    node_name: str
    role: str
    password: str
    rotated: bool  # the role existed: its old password no longer works


def role_name(node_name: str) -> str:
    """``gpup_node_<name>``, dashes as underscores; a name too long gets a hash for its end."""
    role = PREFIX + re.sub(r"[^a-z0-9_]", "_", node_name.lower())
    if len(role) > MAX_ROLE:
        digest = hashlib.sha256(node_name.encode()).hexdigest()[:8]
        role = role[: MAX_ROLE - 9] + "_" + digest
    return role


def _role_exists(role: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        return cursor.fetchone() is not None


_SUPERUSER_ONLY = ("SUPERUSER", "REPLICATION", "BYPASSRLS")


@dataclass(frozen=True)
class _Roles:
    """What ``node_credential_issue`` needs to know of the roles, read in one query."""

    superuser: bool  # the platform's own role (current_user) is one
    group: bool  # the group role GROUP exists
    role: tuple[bool, bool, bool] | None  # the node's role's _SUPERUSER_ONLY; None: no such role


def _roles(role: str) -> _Roles:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                   EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s),
                   (SELECT ARRAY[rolsuper, rolreplication, rolbypassrls]
                      FROM pg_roles WHERE rolname = %s)
            """,
            [GROUP, role],
        )
        superuser, group, attributes = cursor.fetchone()
    return _Roles(superuser, group, tuple(attributes) if attributes is not None else None)


def _superuser_attributes(role: str, roles: _Roles) -> str:
    """What the role statement says of the attributes only a superuser may give or take away.

    PostgreSQL (15) refuses an ALTER ROLE naming SUPERUSER, REPLICATION or BYPASSRLS at all,
    even to say NO, from a role that is not a superuser: the platform's own role, with
    CREATEROLE, as docs/multi-host.md sets it up. Such a role cannot have given them either, so
    an existing role is checked for them instead, and refused if someone has."""
    if roles.role is None or roles.superuser:
        return "NOSUPERUSER NOREPLICATION NOBYPASSRLS"
    granted = [name for name, held in zip(_SUPERUSER_ONLY, roles.role, strict=True) if held]
    if granted:
        raise CredentialError(
            f"role {role} has {', '.join(granted)}, which only a superuser may take away: "
            "ALTER ROLE it as one, or revoke the credential and create it again"
        )
    return ""


def _run(statement: sql.Composable) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(connection.connection))


@transaction.atomic
def node_credential_issue(*, node_name: str, role: str | None = None, rotate_only: bool = False):
    """Make (or give a new password to) ``node_name``'s role, a member of ``gpup_nodes``, and
    map it to the node. Idempotent but for the password, which is new every time: the old one
    stops working at once (sessions already open keep going until they end)."""
    known = NodeCredential.objects.filter(node_name=node_name).first()
    if rotate_only and known is None:
        raise CredentialError(f"node {node_name} has no credential: create one first")
    role = role or (known.role if known else role_name(node_name))
    roles = _roles(role)
    if not roles.group:
        raise CredentialError(
            f"the group role {GROUP} is missing: run `manage.py migrate` (as a role allowed to "
            "create roles) first"
        )
    existed = roles.role is not None
    password = secrets.token_urlsafe(32)
    hashed = connection.connection.pgconn.encrypt_password(
        password.encode(), role.encode(), b"scram-sha-256"
    ).decode()
    # NOINHERIT off: the group's grants are the role's; no other right.
    _run(
        sql.SQL("{} ROLE {} LOGIN NOCREATEDB NOCREATEROLE {} PASSWORD {}").format(
            sql.SQL("ALTER" if existed else "CREATE"),
            sql.Identifier(role),
            sql.SQL(_superuser_attributes(role, roles)),
            sql.Literal(hashed),
        )
    )
    _run(sql.SQL("GRANT {} TO {}").format(sql.Identifier(GROUP), sql.Identifier(role)))
    _run(
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(connection.settings_dict["NAME"]), sql.Identifier(role)
        )
    )
    now = timezone.now()
    if known is None:
        NodeCredential.objects.filter(role=role).delete()  # a role renamed to another node
        NodeCredential.objects.create(node_name=node_name, role=role, created_at=now,
                                      rotated_at=now)  # fmt: skip
    else:
        NodeCredential.objects.filter(pk=known.pk).update(role=role, rotated_at=now)
    return Issued(node_name=node_name, role=role, password=password, rotated=existed)


@dataclass(frozen=True)
class Revoked:
    role: str
    # The role's open sessions ended, or None where this role may not end them (not a
    # superuser, nor a member of pg_signal_backend): they go on until they end.
    sessions_ended: int | None


@transaction.atomic
def node_credential_revoke(*, node_name: str) -> Revoked | None:
    """Drop ``node_name``'s role and its mapping, ending the role's open sessions where this
    role may. None when the node had no credential."""
    known = NodeCredential.objects.filter(node_name=node_name).first()
    if known is None:
        return None
    known.delete()
    ended = 0
    if _role_exists(known.role):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                    " FROM pg_stat_activity WHERE usename = %s",
                    [known.role],
                )
                (ended,) = cursor.fetchone()
        except ProgrammingError as exc:
            if not isinstance(exc.__cause__, errors.InsufficientPrivilege):
                raise
            ended = None
        # Its only grant of its own (the rest is gpup_nodes', which goes with the role). Not
        # DROP OWNED: that needs the role's privileges, which a CREATEROLE role lacks.
        _run(
            sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
                sql.Identifier(connection.settings_dict["NAME"]), sql.Identifier(known.role)
            )
        )
        _run(sql.SQL("DROP ROLE {}").format(sql.Identifier(known.role)))
    return Revoked(role=known.role, sessions_ended=ended)


def database_url(issued: Issued, *, host: str | None = None, port: str | None = None) -> str:
    """The ``DATABASE_URL`` of the node's agent: this platform's database, as ``issued``'s role,
    on ``host``/``port`` (default: where this process reaches the server, which may not be
    where the node does)."""
    db = connection.settings_dict
    host = host or database_host(db)
    if not host or host.startswith("/"):
        raise CredentialError(
            "this process reaches PostgreSQL through a Unix socket: give --host, the address "
            "the node reaches the server on"
        )
    port = port or str(db.get("PORT") or "")
    netloc = f"{quote(issued.role, safe='')}:{quote(issued.password, safe='')}@"
    netloc += hosts_netloc(host, port)
    return f"postgres://{netloc}/{quote(db['NAME'], safe='')}{query(db)}"


def node_scope() -> str | None:
    """The node this process's database role is confined to (a node credential's; "" for a
    member of ``gpup_nodes`` mapped to no node), or None for the platform's own role. Asked of
    the server once per connection settings."""
    key = (connection.settings_dict.get("USER"), connection.settings_dict.get("NAME"))
    if key not in _scopes:
        with connection.cursor() as cursor:
            cursor.execute(_MEMBER, [GROUP])
            scope = None
            if cursor.fetchone()[0]:
                cursor.execute("SELECT gpup_node_name()")
                scope = cursor.fetchone()[0] or ""
        _scopes[key] = scope
    return _scopes[key]


_MEMBER = """SELECT EXISTS (SELECT 1 FROM pg_auth_members m
                               JOIN pg_roles g ON g.oid = m.roleid
                               JOIN pg_roles u ON u.oid = m.member
                              WHERE g.rolname = %s AND u.rolname = session_user)"""
_scopes: dict[tuple, str | None] = {}
