"""Every method on every path answers without a 5xx: a method a view does not handle is a 405
with ``Allow``, but only after the object the path names was found in the caller's tenant
(another tenant's id is a 404 whatever the method); a whole number in the path past bigint is a
400 naming it. Paths come from the OpenAPI schema, so a new endpoint is checked unnamed."""

from __future__ import annotations

import re

import pytest

from gpuplatform.query import BIGINT_MAX
from tenants.models import ApiToken, Role
from tests.api.conftest import api_client, assert_error_shape, bearer, make_actor
from tests.factories import TaskFactory, TenantFactory

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def schema_paths() -> dict[str, set[str]]:
    """Each path of the schema with the methods it documents (and HEAD with GET, OPTIONS)."""
    response = api_client().get(f"{API}schema/", {"format": "json"})
    assert response.status_code == 200
    paths = {}
    for path, operations in response.json()["paths"].items():
        documented = {method.upper() for method in operations if method.upper() in METHODS}
        if "GET" in documented:
            documented.add("HEAD")
        paths[path] = documented | {"OPTIONS"}
    return paths


@pytest.fixture
def world(owner, operator, settings):
    settings.API_THROTTLE_RATE = "1000000/s"
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, state="running", attempt=1)
    token = ApiToken.objects.filter(user=owner.user).get()
    # An admin of another tenant: no role refusal (403) stands between it and the tenant wall.
    outsider = make_actor(TenantFactory(name="nlp-lab"), Role.ADMIN, "charlie")
    return {"task": task, "token": token, "owner": owner, "outsider": outsider,
            "operator": operator}  # fmt: skip


def _owners_url(world, path: str, id: str | None = None) -> str:
    """``path`` naming the owner's objects: its task, its token, itself (or ``id``)."""
    values = {
        "id": id or str(world["token"].pk if "tokens/" in path else world["task"].pk),
        "username": world["owner"].user.username,
        "name": world["owner"].tenant.name,
    }
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


def _call(client, method: str, url: str):
    return getattr(client, method.lower())(url)


def tenant_paths_with_an_object() -> list[str]:
    return [p for p in schema_paths() if "{" in p and not p.startswith(f"{API}operator/")]


def test_every_path_of_the_schema_is_checked_here(db):
    paths = schema_paths()
    assert f"{API}tasks/{{id}}/" in paths and f"{API}tenant/members/{{username}}/" in paths
    assert paths[f"{API}tasks/{{id}}/"] == {"GET", "HEAD", "OPTIONS"}


def test_a_method_a_path_does_not_handle_is_a_405_with_allow(world):
    owner = bearer(world["owner"].token)
    operator = bearer(world["operator"].token)
    for path, handled in schema_paths().items():
        if path.startswith(f"{API}operator/") and "{" in path:
            continue  # operators' objects: see the next test
        client = operator if path.startswith(f"{API}operator/") else owner
        for method in sorted(set(METHODS) - handled):
            response = _call(client, method, _owners_url(world, path))
            assert response.status_code == 405, (method, path, response.status_code)
            if method != "HEAD":
                assert_error_shape(response, 405)
            allowed = {m.strip() for m in response["Allow"].split(",")}
            assert method not in allowed and allowed & handled, (method, path, allowed)


def test_another_tenants_object_is_not_found_whatever_the_method(world):
    outsider = bearer(world["outsider"].token)
    for path in tenant_paths_with_an_object():
        url = _owners_url(world, path)
        for method in METHODS:
            response = _call(outsider, method, url)
            assert response.status_code == 404, (method, url, response.status_code)
            if method != "HEAD":
                assert_error_shape(response, 404)
    assert ApiToken.objects.filter(pk=world["token"].pk, revoked_at=None).exists()


@pytest.mark.parametrize("number", [str(BIGINT_MAX + 1), "9" * 20, "9" * 300])
def test_a_path_id_past_bigint_is_a_400_naming_it(world, number):
    owner, operator = bearer(world["owner"].token), bearer(world["operator"].token)
    for path, handled in schema_paths().items():
        if "{id}" not in path:
            continue
        client = operator if path.startswith(f"{API}operator/") else owner
        url = _owners_url(world, path, id=number)
        for method in sorted(handled - {"HEAD", "OPTIONS"}):
            response = _call(client, method, url)
            body = assert_error_shape(response, 400, "id")
            assert "must be a whole number from 0 to 9223372036854775807" in body["detail"]


def test_a_path_id_past_bigint_still_needs_credentials_first(world):
    response = api_client().get(f"{API}tasks/{BIGINT_MAX + 1}/")
    assert response.status_code == 401
