"""Query parameters are read by serializers (gpuplatform.query): a malformed or out-of-range
value is a 400 naming the parameter, never a 500; numbers that reach PostgreSQL stop at its
bigint (or integer) range. Every list that takes ``offset`` is found in the OpenAPI schema, so
a new list is checked without being named here."""

from __future__ import annotations

import re

import pytest

from gpuplatform.query import BIGINT_MAX, INT_MAX
from scheduling.models import TaskAttempt
from tests.api.conftest import api_client, assert_error_shape, bearer
from tests.factories import NodeFactory, TaskFactory

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"
TOO_BIG = "99999999999999999999"  # past bigint: psycopg sends it as numeric, OFFSET refuses


@pytest.fixture
def world(owner, operator, workstation, tmp_path, settings):
    settings.API_THROTTLE_RATE = "1000000/s"  # many requests, none of them about pacing
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, state="running", attempt=1)
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"hello\n")
    TaskAttempt.objects.create(task=task, number=1, node=NodeFactory(), log_path=str(log))
    return {
        "task": task,
        "tenant": bearer(owner.token),
        "operator": bearer(operator.token),
        "values": {"id": str(task.pk), "name": owner.tenant.name},
    }


def lists_with_offset() -> list[str]:
    """Every GET with an ``offset`` parameter: the lists' paging (and a log's byte offset)."""
    response = api_client().get(f"{API}schema/", {"format": "json"})
    assert response.status_code == 200
    return [
        path
        for path, operations in response.json()["paths"].items()
        if any(p["name"] == "offset" for p in operations.get("get", {}).get("parameters", []))
    ]


def _url(world, path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: world["values"][m.group(1)], path)


def _client(world, path: str):
    return world["operator"] if path.startswith(f"{API}operator/") else world["tenant"]


def test_every_list_that_takes_offset_refuses_one_past_bigint(world):
    paths = lists_with_offset()
    assert {f"{API}tasks/", f"{API}gpus/", f"{API}tokens/", f"{API}operator/tasks/"} <= set(paths)
    for path in paths:
        response = _client(world, path).get(_url(world, path), {"offset": TOO_BIG})
        body = assert_error_shape(response, 400, "offset")
        assert str(BIGINT_MAX) in body["errors"]["offset"][0], path


def test_every_list_that_takes_offset_pages_past_its_end_at_bigints_edge(world):
    pages = 0
    for path in lists_with_offset():
        for params in ({"offset": str(BIGINT_MAX)}, {"offset": str(BIGINT_MAX), "limit": "500"}):
            response = _client(world, path).get(_url(world, path), params)
            assert response.status_code == 200, (path, response.content[:300])
            if "results" in response.json():  # a page (the log's offset is a byte offset)
                assert response.json()["results"] == [], path
                pages += 1
    assert pages >= 20


@pytest.mark.parametrize("value", [TOO_BIG, "0", "-1", "1e3", "²"])
def test_a_limit_outside_1_to_bigint_is_a_400(world, value):
    assert_error_shape(world["tenant"].get(f"{API}tasks/", {"limit": value}), 400, "limit")


def test_a_limit_past_500_is_cut_to_500(world):
    response = world["tenant"].get(f"{API}gpus/", {"limit": str(BIGINT_MAX)})
    assert response.status_code == 200 and len(response.json()["results"]) == 4


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("attempt", str(INT_MAX + 1)),
        ("attempt", "x"),
        ("offset", TOO_BIG),
        ("tail", str(INT_MAX + 1)),
        ("limit", "-1"),
    ],
)
def test_a_log_parameter_out_of_range_is_a_400(world, param, value):
    response = world["tenant"].get(f"{API}tasks/{world['task'].pk}/log/", {param: value})
    body = assert_error_shape(response, 400, param)
    assert repr(value) in body["errors"][param][0]


def test_a_log_read_at_the_edge_of_its_ranges_answers(world):
    url = f"{API}tasks/{world['task'].pk}/log/"
    response = world["tenant"].get(url, {"offset": str(BIGINT_MAX), "limit": str(BIGINT_MAX)})
    assert response.status_code == 200 and response.json()["text"] == ""
    assert world["tenant"].get(url, {"tail": str(INT_MAX)}).json()["text"] == "hello\n"
    assert world["tenant"].get(url, {"attempt": str(INT_MAX)}).status_code == 404


@pytest.mark.parametrize("url", ["usage/", "usage/sampled/", "operator/usage/sampled/"])
@pytest.mark.parametrize("value", ["0", "367", TOO_BIG, "abc", ""])
def test_usage_days_outside_1_to_366_is_a_400(world, url, value):
    response = _client(world, API + url).get(API + url, {"days": value})
    assert_error_shape(response, 400, "days")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": TOO_BIG}, "since"),
        ({"step": TOO_BIG}, "step"),
        ({"start": "1969-12-31T00:00:00Z"}, "start"),
        ({"end": "0001-01-01T00:00:00Z"}, "end"),
    ],
)
def test_a_metrics_range_out_of_bounds_is_a_400(world, params, field):
    response = world["tenant"].get(f"{API}tasks/{world['task'].pk}/metrics/", params)
    assert_error_shape(response, 400, field)


def test_a_metrics_range_reaching_before_the_epoch_starts_there(world):
    response = world["operator"].get(f"{API}operator/gpus/live/")
    assert response.status_code == 200
    node = world["task"].attempts.get().node
    response = world["operator"].get(
        f"{API}operator/nodes/{node.name}/metrics/",
        {"end": "1970-01-02T00:00:00Z", "since": "30d", "step": "1h"},
    )
    assert response.status_code == 200, response.content[:300]
    assert response.json()["start"].startswith("1970-01-01T00:00:00")


@pytest.mark.parametrize(
    ("url", "params", "field"),
    [
        ("tasks/", {"state": "runing"}, "state"),
        ("tasks/", {"queue": "a\x00b"}, "queue"),
        ("tasks/", {"submitted_after": "yesterday"}, "submitted_after"),
        ("alerts/", {"open": "maybe"}, "open"),
        ("operator/tasks/", {"state": "done"}, "state"),
        ("operator/alerts/", {"open": "2"}, "open"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(world, url, params, field):
    response = _client(world, API + url).get(API + url, params)
    assert_error_shape(response, 400, field)


def test_empty_filters_filter_nothing(world):
    body = world["tenant"].get(f"{API}tasks/", {"state": "", "queue": "", "name": ""}).json()
    assert [task["id"] for task in body["results"]] == [world["task"].pk]
    assert world["tenant"].get(f"{API}alerts/", {"open": "yes"}).status_code == 200


def test_the_operators_task_list_filters_by_tenant_and_state(world, outsider):
    TaskFactory(tenant=outsider.tenant, state="pending")
    client = world["operator"]
    body = client.get(f"{API}operator/tasks/", {"tenant": "vision-lab", "state": "running"}).json()
    assert [task["id"] for task in body["results"]] == [world["task"].pk]
    assert client.get(f"{API}operator/tasks/", {"tenant": "nlp-lab"}).json()["count"] == 1
