"""Paging parameters of every list: a bad `limit` or `offset` is a 400 naming it, like every
other bad parameter, never silently replaced by the default."""

from __future__ import annotations

import pytest

from scheduling.models import Task
from tests.api.conftest import assert_error_shape, bearer

pytestmark = pytest.mark.usefixtures("fresh_cache")


@pytest.fixture
def alice(owner):
    Task.objects.bulk_create(
        Task(tenant=owner.tenant, name=f"t{i}", command="true") for i in range(3)
    )
    return bearer(owner.token)


@pytest.mark.parametrize(
    "param, value",
    [
        ("limit", "abc"),
        ("limit", "0"),
        ("limit", "-5"),
        ("limit", "1.5"),
        ("limit", "²"),
        ("limit", ""),
        ("offset", "abc"),
        ("offset", "-1"),
    ],
)
@pytest.mark.parametrize("url", ["/api/v1/tasks/", "/api/v1/gpus/", "/api/v1/tokens/"])
def test_a_bad_paging_parameter_answers_400_naming_it(alice, url, param, value):
    body = assert_error_shape(alice.get(url, {param: value}), 400, param)

    assert repr(value) in body["errors"][param][0]


def test_good_paging_parameters_page(alice):
    body = alice.get("/api/v1/tasks/", {"limit": "2", "offset": "1"}).json()

    assert body["count"] == 3
    assert [task["name"] for task in body["results"]] == ["t1", "t0"]


def test_without_paging_parameters_the_first_50_come(alice):
    body = alice.get("/api/v1/tasks/").json()

    assert len(body["results"]) == 3 and body["next"] is None
