"""tenants.access.caller_for: who calls and for which tenant, from a Django request (session),
a DRF request (session or API token) and a Channels scope (session, token or nobody)."""

from __future__ import annotations

from importlib import import_module

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from tenants import access
from tenants.access import SESSION_KEY, caller_for
from tenants.authentication import ApiTokenAuthentication
from tenants.models import Membership, Role
from tenants.roles import Action
from tests.factories import TenantFactory

SessionStore = import_module(settings.SESSION_ENGINE).SessionStore


def page(user, path: str = "/portal/", session: dict | None = None, **headers):
    """A portal page's request (Django's): the session's user."""
    request = RequestFactory().get(path, **headers)
    request.user = user
    request.session = SessionStore()
    request.session.update(session or {})
    return request


def api(path: str = "/api/v1/tasks/", *, user=None, token: str | None = None, **headers):
    """An API request (DRF's): a token, or a session's user."""
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    raw = APIRequestFactory().get(path, **headers)
    raw.session = SessionStore()
    if user is not None:
        raw.user = user
        raw._force_auth_user = user
    return Request(raw, authenticators=[ApiTokenAuthentication()] if token else [])


def scope(*, user=None, token: str | None = None, query: bytes = b"", session: dict | None = None):
    """A websocket's scope as channels' AuthMiddlewareStack leaves it."""
    headers = [(b"origin", b"http://localhost")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    store = SessionStore()
    store.update(session or {})
    return {
        "type": "websocket",
        "headers": headers,
        "query_string": query,
        "user": user if user is not None else AnonymousUser(),
        "session": store,
    }


def second_tenant(actor, name: str = "robotics", role: str = Role.VIEWER):
    other = TenantFactory(name=name)
    Membership.objects.create(user=actor.user, tenant=other, role=role)
    return other


# --- A portal page: the session ------------------------------------------------------------------


def test_a_session_acts_for_its_users_only_tenant(owner):
    caller = caller_for(page(owner.user))
    assert (caller.tenant, caller.role, caller.chosen_by) == (owner.tenant, Role.ADMIN, "only")
    assert caller.token is None and caller.user_id == owner.user.pk
    assert caller.may(Action.MANAGE_MEMBERS)


def test_a_session_acts_for_the_tenant_picked_in_the_switcher(owner):
    other = second_tenant(owner)
    caller = caller_for(page(owner.user, session={SESSION_KEY: other.pk}))
    assert (caller.tenant, caller.role, caller.chosen_by) == (other, Role.VIEWER, "picked")
    assert caller.tenant_ids == {owner.tenant.pk, other.pk}
    assert not caller.may(Action.SUBMIT)


def test_without_a_pick_a_session_of_several_tenants_acts_for_the_first_by_name(owner):
    second_tenant(owner, name="zoology")
    caller = caller_for(page(owner.user))
    assert (caller.tenant, caller.chosen_by) == (owner.tenant, "first")  # vision-lab < zoology


def test_a_pick_the_user_lost_since_is_ignored(owner, outsider):
    caller = caller_for(page(owner.user, session={SESSION_KEY: outsider.tenant.pk}))
    assert caller.tenant == owner.tenant


def test_pick_refuses_a_tenant_the_user_is_not_in(owner, outsider):
    other = second_tenant(owner)
    request = page(owner.user)
    assert not access.pick(request, outsider.tenant.name)
    assert access.pick(request, other.name)
    assert request.session[SESSION_KEY] == other.pk


def test_a_tenant_named_in_the_query_or_header_wins_over_the_pick(owner):
    other = second_tenant(owner)
    picked = {SESSION_KEY: owner.tenant.pk}
    assert caller_for(page(owner.user, f"/portal/?tenant={other.name}", picked)).tenant == other
    named = page(owner.user, "/portal/", picked, HTTP_X_TENANT=other.name)
    assert (caller_for(named).tenant, caller_for(named).chosen_by) == (other, "named")


def test_naming_another_tenant_acts_for_none_and_says_why(owner, outsider):
    caller = caller_for(page(owner.user, f"/portal/?tenant={outsider.tenant.name}"))
    assert caller.tenant is None and caller.role == ""
    assert caller.problem == "you are not a member of tenant nlp-lab"
    assert not caller.may(Action.READ)
    with pytest.raises(PermissionDenied):
        caller.require(Action.READ)


def test_a_user_of_no_active_tenant_acts_for_none(owner):
    owner.tenant.is_active = False
    owner.tenant.save()
    caller = caller_for(page(owner.user))
    assert caller.tenant is None and caller.memberships == ()
    assert caller.problem == "you are not a member of any active tenant"


def test_nobody_signed_in_is_no_caller(db):
    assert caller_for(page(AnonymousUser())) is None


def test_a_request_is_resolved_once(owner, django_assert_num_queries):
    request = page(owner.user)
    with django_assert_num_queries(1):
        first = caller_for(request)
        assert caller_for(request) is first


# --- An API request: a token, or a session ------------------------------------------------------


def test_an_api_token_acts_for_its_own_tenant_with_its_owners_role(teammate):
    second_tenant(teammate, name="aaa-first-by-name", role=Role.ADMIN)
    caller = caller_for(api(token=teammate.token))
    assert (caller.tenant, caller.role, caller.chosen_by) == (teammate.tenant, Role.MEMBER, "token")
    assert caller.token is not None and caller.token.tenant_id == teammate.tenant.pk
    assert caller.tenant_ids == {teammate.tenant.pk}  # the token's tenant, not the user's others


def test_an_api_token_ignores_a_tenant_named_beside_it(teammate, outsider):
    caller = caller_for(api(token=teammate.token, HTTP_X_TENANT=outsider.tenant.name))
    assert caller.tenant == teammate.tenant


def test_an_api_session_acts_as_a_portal_session_does(owner):
    other = second_tenant(owner)
    assert caller_for(api(user=owner.user)).chosen_by == "first"
    named = caller_for(api(f"/api/v1/tasks/?tenant={other.name}", user=owner.user))
    assert (named.tenant, named.chosen_by) == (other, "named")


# --- A websocket's scope ------------------------------------------------------------------------


def test_a_socket_with_a_session_acts_for_its_user(owner):
    other = second_tenant(owner)
    caller = caller_for(scope(user=owner.user, session={SESSION_KEY: other.pk}))
    assert (caller.tenant, caller.chosen_by) == (other, "picked")
    assert caller.tenant_ids == {owner.tenant.pk, other.pk}
    assert not caller.operator


def test_a_socket_with_a_token_acts_for_the_tokens_tenant(teammate, outsider):
    caller = caller_for(scope(token=teammate.token, user=outsider.user))  # the token wins
    assert (caller.user, caller.tenant, caller.role) == (teammate.user, teammate.tenant, "member")
    assert caller.chosen_by == "token"


def test_a_socket_names_its_tenant_in_the_query_string(owner):
    other = second_tenant(owner)
    caller = caller_for(scope(user=owner.user, query=f"tenant={other.name}".encode()))
    assert (caller.tenant, caller.chosen_by) == (other, "named")


@pytest.mark.parametrize("token", ["gpup_AAAAAAAA_" + "x" * 40, "not a token", ""])
def test_a_socket_with_a_refused_token_is_no_caller(owner, token):
    assert caller_for(scope(token=token, user=owner.user)) is None


def test_an_anonymous_socket_is_no_caller(db):
    assert caller_for(scope()) is None


def test_an_inactive_users_socket_is_no_caller(owner):
    owner.user.is_active = False
    owner.user.save()
    assert caller_for(scope(user=owner.user)) is None


def test_an_operator_with_no_tenant_is_a_caller_acting_for_none(db):
    from tests.factories import UserFactory

    olga = UserFactory(username="olga", is_staff=True)
    caller = caller_for(scope(user=olga))
    assert caller.operator and caller.tenant is None and caller.tenant_ids == frozenset()
