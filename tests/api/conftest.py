"""API test helpers: bearer clients, a viewer and an operator beside the three actors, and the
one error shape every 4xx answers."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient, ForceAuthClientHandler

from tenants import services as tenant_services
from tenants.models import Role
from tests.conftest import Actor
from tests.factories import MembershipFactory, TenantFactory, UserFactory


@pytest.fixture
def fresh_cache(db):
    """Throttle counters live in the shared database cache, where a transactional test
    elsewhere may have committed some: no test here inherits another's requests. (Not
    autouse: other modules in this folder decide for themselves.)"""
    cache.clear()
    yield
    cache.clear()


# One request handler for every client: each new handler loads the middleware again, and
# WhiteNoise's scans every static file (tens of ms a client). Nothing here uses
# force_authenticate, the only per-client state a handler keeps.
_HANDLER = ForceAuthClientHandler(enforce_csrf_checks=False)


def api_client() -> APIClient:
    client = APIClient()
    client.handler = _HANDLER
    return client


def bearer(secret: str) -> APIClient:
    client = api_client()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def make_actor(tenant, role: str, username: str, *, staff: bool = False) -> Actor:
    user = UserFactory(username=username, is_staff=staff)
    MembershipFactory(user=user, tenant=tenant, role=role)
    _, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="test")
    return Actor(user=user, tenant=tenant, token=secret)


@pytest.fixture
def viewer(lab) -> Actor:
    """Dave: may read the vision lab, not write to it."""
    return make_actor(lab, Role.VIEWER, "dave")


@pytest.fixture
def operator(db) -> Actor:
    """Olga: a platform operator (staff), member of the operations tenant only."""
    return make_actor(TenantFactory(name="ops"), Role.ADMIN, "olga", staff=True)


def assert_error_shape(response, status: int, field: str | None = None) -> dict:
    """``{"detail": str, "errors": {field: [reasons]}}``; ``field`` named when given."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"detail", "errors"}, body
    assert isinstance(body["detail"], str) and body["detail"], body
    assert isinstance(body["errors"], dict), body
    for name, reasons in body["errors"].items():
        assert isinstance(name, str), body
        assert reasons and all(isinstance(r, str) and r for r in reasons), body
    if field is not None:
        assert field in body["errors"], body
        assert body["detail"].startswith(f"{next(iter(body['errors']))}:"), body
    return body


def assert_constant_queries(client: APIClient, url: str, grow) -> int:
    """A page of 20 rows costs as many queries as a page of one (or a few): ``grow()`` adds the
    rows between the two reads. Returns the count."""
    few, body = _queries_for(client, url)
    grow()
    many, grown = _queries_for(client, url)
    assert len(body["results"]) <= 3, body["results"]
    assert len(grown["results"]) >= 20, len(grown["results"])
    assert few == many, f"{url}: {few} queries with one row, {many} with {grown['count']}"
    return many


def _queries_for(client: APIClient, url: str) -> tuple[int, dict]:
    # A warm-up request first, so per-minute writes (a token's last_used_at) do not count.
    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return len(queries), response.json()
