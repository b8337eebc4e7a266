"""What every page's header needs: the tenant acted for, the others to switch to, the role."""

from __future__ import annotations

from django.http import HttpRequest

from tenants import access
from tenants.roles import Action


def portal(request: HttpRequest) -> dict:
    if not request.path.startswith("/portal/"):
        return {}
    who = access.caller_for(request)
    if who is None or who.tenant is None:
        return {}
    return {
        "caller": who,
        "memberships": who.memberships,
        "may_submit": who.may(Action.SUBMIT),
        "is_tenant_admin": who.may(Action.MANAGE_MEMBERS),
    }
