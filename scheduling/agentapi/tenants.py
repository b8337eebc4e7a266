"""What a node agent may know of the tenants: which exist, and the Unix users operators gave
them, so that a node can tell the users it made for tenants since deleted (``manage.py
tenant_users``) from those still in use. Names only: nothing else of a tenant crosses."""

from __future__ import annotations

from dataclasses import dataclass

from tenants.models import Tenant


@dataclass(frozen=True)
class KnownTenants:
    names: frozenset[str]
    unix_users: frozenset[str]  # operator-set ``Tenant.unix_user`` values


def known_tenants() -> KnownTenants:
    rows = list(Tenant.objects.values_list("name", "unix_user"))
    return KnownTenants(
        names=frozenset(name for name, _ in rows),
        unix_users=frozenset(user for _, user in rows if user),
    )
