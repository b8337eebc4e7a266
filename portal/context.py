"""What every page's header needs: the tenant acted for, the others to switch to, the role."""

from __future__ import annotations

from django.http import HttpRequest

from portal import tenancy
from tenants.roles import Action


def portal(request: HttpRequest) -> dict:
    if not request.path.startswith("/portal/"):
        return {}
    who = tenancy.caller(request)
    if who is None:
        return {}
    return {
        "caller": who,
        "memberships": tenancy.memberships(request),
        "may_submit": who.may(Action.SUBMIT),
        "is_tenant_admin": who.may(Action.MANAGE_MEMBERS),
    }
