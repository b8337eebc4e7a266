"""Reads of a tenant's members, tokens and quota limits (what it uses: ``scheduling.usage``).
Every one takes the tenant (and, where the answer depends on who asks, the user) as a required
keyword argument: callers cannot forget to scope a read. The API, the admin, the portal and
websocket consumers read through these."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from tenants.models import ApiToken, Membership, Quota, Tenant


def member_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user")


def member_get(*, tenant: Tenant, username: str) -> Membership:
    """One member of the tenant by username, or 404."""
    return get_object_or_404(member_list(tenant=tenant), user__username=username)


def token_list(*, tenant: Tenant, user: AbstractBaseUser | None) -> QuerySet[ApiToken]:
    """The tokens ``user`` holds in the tenant; every member's with ``user=None`` (admins)."""
    tokens = ApiToken.objects.filter(tenant=tenant).select_related("tenant", "user")
    return tokens if user is None else tokens.filter(user=user)


# --- Quota, use and fair share ------------------------------------------------------------------


def quota_limits(*, tenant: Tenant) -> list[Quota]:
    """The tenant's quotas: the cluster-wide one (pool empty) and one per pool."""
    return list(Quota.objects.filter(tenant=tenant).select_related("pool"))
