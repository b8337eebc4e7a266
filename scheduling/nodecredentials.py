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

from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

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
    if not _role_exists(GROUP):
        raise CredentialError(
            f"the group role {GROUP} is missing: run `manage.py migrate` (as a role allowed to "
            "create roles) first"
        )
    existed = _role_exists(role)
    password = secrets.token_urlsafe(32)
    hashed = connection.connection.pgconn.encrypt_password(
        password.encode(), role.encode(), b"scram-sha-256"
    ).decode()
    verb = "ALTER" if existed else "CREATE"
    # NOINHERIT off: the group's grants are the role's; no other right.
    _run(
        sql.SQL(
            "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
            " PASSWORD {}"
        ).format(sql.SQL(verb), sql.Identifier(role), sql.Literal(hashed))
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


@transaction.atomic
def node_credential_revoke(*, node_name: str) -> str | None:
    """Drop ``node_name``'s role and its mapping, ending the role's open sessions. Returns the
    role dropped, or None when the node had none."""
    known = NodeCredential.objects.filter(node_name=node_name).first()
    if known is None:
        return None
    known.delete()
    if _role_exists(known.role):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [known.role],
            )
        # Its CONNECT grant on this database goes with DROP OWNED; it owns nothing else.
        _run(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(known.role)))
        _run(sql.SQL("DROP ROLE {}").format(sql.Identifier(known.role)))
    return known.role


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
