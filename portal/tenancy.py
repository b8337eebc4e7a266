"""Which tenant a browser acts for: the one picked in the tenant switcher (kept in the session),
or the user's first. The same ``Caller`` the API builds, so the role checks are the same."""

from __future__ import annotations

from django.http import HttpRequest

from gpuplatform.api import Caller
from tenants import selectors
from tenants.models import Membership

SESSION_KEY = "portal_tenant"


def memberships(request: HttpRequest) -> list[Membership]:
    cached = getattr(request, "_portal_memberships", None)
    if cached is None:
        user = request.user
        cached = selectors.memberships_of(user=user) if user.is_authenticated else []
        request._portal_memberships = cached
    return cached


def caller(request: HttpRequest) -> Caller | None:
    """The signed-in user's tenant and role here, or None when it belongs to no active tenant."""
    found = memberships(request)
    if not found:
        return None
    wanted = request.session.get(SESSION_KEY)
    chosen = next((m for m in found if m.tenant_id == wanted), found[0])
    return Caller(chosen.tenant, chosen.role, request.user.pk)


def switch(request: HttpRequest, tenant_name: str) -> bool:
    """Act for ``tenant_name`` from now on; False when the user is not a member there."""
    chosen = next((m for m in memberships(request) if m.tenant.name == tenant_name), None)
    if chosen is None:
        return False
    request.session[SESSION_KEY] = chosen.tenant_id
    return True
