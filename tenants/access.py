"""Who is calling, and for which tenant: the one function that answers it, ``caller_for``, for
the API (a DRF request: API token or session), the portal (a Django request: session) and the
websockets (a Channels scope: ``Authorization: Bearer`` token or session). Everything a tenant
may see is then read through selectors that take ``caller.tenant``.

The tenant, in this order: an API token's own; the one named by the ``X-Tenant`` header or the
``tenant`` query parameter; the one picked in the portal's switcher (kept in the session); the
user's only one; else the first by name (``chosen_by == "first"``: the API refuses to guess
and asks for a name, the portal shows the switcher).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext as _
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from tenants import roles
from tenants.authentication import ApiTokenAuthentication, TokenContext
from tenants.models import ApiToken, Membership, Tenant
from tenants.roles import Action

# The tenant picked in the portal's switcher (``pick``), by id.
SESSION_KEY = "portal_tenant"
TENANT_HEADER = "HTTP_X_TENANT"
TENANT_PARAM = "tenant"

ChosenBy = Literal["token", "named", "picked", "only", "first", ""]


@dataclass(frozen=True)
class Caller:
    """A signed-in user (or a token's), the tenant it acts for and its role there.

    ``tenant`` is None when it acts for none: ``problem`` says why (not a member of the tenant
    named, or of any active tenant). ``memberships``: every tenant it may act for, the token's
    alone for a token (the portal's switcher, the live socket's groups)."""

    user: AbstractBaseUser
    tenant: Tenant | None
    role: str
    memberships: tuple[Membership, ...]
    token: ApiToken | None = None
    chosen_by: ChosenBy = ""
    problem: str = ""

    @property
    def user_id(self) -> int:
        return self.user.pk

    @property
    def operator(self) -> bool:
        return bool(self.user.is_staff)

    @property
    def tenant_ids(self) -> frozenset[int]:
        return frozenset(m.tenant_id for m in self.memberships)

    def may(self, action: Action, obj: roles.Owned | None = None) -> bool:
        if self.tenant is None:
            return False
        return roles.may(role=self.role, action=action, user_id=self.user_id, obj=obj)

    def require(self, action: Action, obj: roles.Owned | None = None) -> None:
        """403 with the reason unless the caller's role allows ``action`` (on ``obj``): Django's
        PermissionDenied, which the API (DRF) and the portal's pages both answer as a 403."""
        if self.tenant is None:
            raise PermissionDenied(self.problem)
        problem = roles.denial(role=self.role, action=action, user_id=self.user_id, obj=obj)
        if problem:
            raise PermissionDenied(problem)


def caller_for(source) -> Caller | None:
    """Who sent ``source`` (a DRF ``Request``, a Django ``HttpRequest`` or a Channels scope)
    and the tenant it acts for; None when nobody is signed in (anonymous, an inactive user, or
    on a websocket a token that is refused). Remembered on a request, so asking again is free.

    A DRF request is authenticated as DRF did it (a refused token has already answered 401); a
    Django request by its session only; a scope by its Bearer token, else its session."""
    if isinstance(source, dict):
        return _for_scope(source)
    cached = getattr(source, "_tenancy_caller", _UNSET)
    if cached is not _UNSET:
        return cached
    context = source.auth if isinstance(source, Request) else None
    params = source.query_params if isinstance(source, Request) else source.GET
    caller = _resolve(
        source.user,
        context if isinstance(context, TokenContext) else None,
        named=source.META.get(TENANT_HEADER) or params.get(TENANT_PARAM) or "",
        session=getattr(source, "session", None),
    )
    source._tenancy_caller = caller
    return caller


def pick(request, tenant_name: str) -> bool:
    """Act for ``tenant_name`` in this browser session from now on (the portal's switcher);
    False when the user is not a member there."""
    caller = caller_for(request)
    chosen = next(
        (m for m in (caller.memberships if caller else ()) if m.tenant.name == tenant_name), None
    )
    if chosen is None:
        return False
    request.session[SESSION_KEY] = chosen.tenant_id
    return True


_UNSET = object()


def _for_scope(scope: dict) -> Caller | None:
    headers = dict(scope.get("headers") or [])
    header = headers.get(b"authorization")
    context = None
    if header is not None:
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != b"bearer":
            return None
        try:
            user, context = ApiTokenAuthentication().authenticate_token(parts[1].decode())
        except (AuthenticationFailed, UnicodeDecodeError):
            return None
    else:
        user = scope.get("user")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    named = headers.get(b"x-tenant", b"").decode("latin-1") or (query.get(TENANT_PARAM) or [""])[0]
    return _resolve(user, context, named=named, session=scope.get("session"))


def _resolve(user, context: TokenContext | None, *, named: str, session) -> Caller | None:
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if context is not None:
        # A token acts for its own tenant with its owner's role there (both checked when it
        # authenticated), whatever tenant a request names.
        membership = Membership(user=user, tenant=context.tenant, role=context.role)
        return Caller(user, context.tenant, context.role, (membership,), context.token, "token")
    found = tuple(
        Membership.objects.filter(user=user, tenant__is_active=True)
        .select_related("tenant")
        .order_by("tenant__name")
    )
    chosen, chosen_by = None, ""
    if named:
        chosen, chosen_by = next((m for m in found if m.tenant.name == named), None), "named"
    else:
        picked = session.get(SESSION_KEY) if session is not None else None
        chosen = next((m for m in found if m.tenant_id == picked), None)
        chosen_by = "picked"
        if chosen is None and found:
            chosen, chosen_by = found[0], "only" if len(found) == 1 else "first"
    if chosen is None:
        if named:
            problem = _("you are not a member of tenant %(name)s") % {"name": named}
        else:
            problem = _("you are not a member of any active tenant")
        return Caller(user, None, "", found, None, "", problem)
    return Caller(user, chosen.tenant, chosen.role, found, None, chosen_by)
