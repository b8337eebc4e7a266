"""GET /api/v1/, the URL `make run` prints: an index of the API's resources, open to anyone."""

from __future__ import annotations

import pytest

from tests.api.conftest import api_client, bearer

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"


def test_the_api_root_lists_its_resources_to_anonymous_callers(db):
    response = api_client().get(API)

    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["version"] == "v1"
    assert body["schema"] == "http://testserver/api/v1/schema/"
    assert body["docs"] == "http://testserver/api/v1/docs/"
    assert "Bearer" in body["authentication"]
    resources = body["resources"]
    assert resources["tasks"]["url"] == "http://testserver/api/v1/tasks/"
    assert resources["gpus"]["url"] == "http://testserver/api/v1/gpus/"
    assert {"me", "nodes", "pools", "quota", "usage", "tokens"} <= set(resources)
    assert all(resource["description"] for resource in resources.values())


def test_every_resource_in_the_index_is_served(owner, settings):
    # One request per resource, back to back: more than one throttle burst.
    settings.API_THROTTLE_BURST = 50
    resources = api_client().get(API).json()["resources"]
    client = bearer(owner.token)

    for name, resource in resources.items():
        path = resource["url"].removeprefix("http://testserver")
        answer = client.get(path)
        # operators' resources refuse a tenant admin, but they exist
        expected = 403 if name.startswith("operator/") else 200
        assert answer.status_code == expected, (name, answer.content[:300])


def test_the_index_is_in_the_schema_without_authentication(db):
    schema = api_client().get(f"{API}schema/", {"format": "json"}).json()

    operation = schema["paths"]["/api/v1/"]["get"]
    assert operation["security"] == [{}]
    assert "ApiIndex" in schema["components"]["schemas"]
