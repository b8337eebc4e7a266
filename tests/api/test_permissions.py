"""Who may call what, over every endpoint and method under /api/v1/.

The matrix below must name every (route, method) the URLconf serves under /api/v1/:
``test_every_api_endpoint_is_in_the_matrix`` enumerates them from the resolver, so a new
endpoint without a row here fails the suite.

Actors: anonymous, the outsider (charlie, another tenant), a viewer (dave, reads the lab), the
teammate (bob, a plain member: the least a writer can be), the owner (alice, tenant admin) and
an operator (olga, staff).

Decision on the schema and the docs (``/api/v1/schema/``, ``/api/v1/docs/``): public. They
describe the API, hold no tenant's data, and someone without a token yet is exactly who reads
them (the CLI and client generators fetch the schema before they have one). The test asserts
they answer anonymous callers and leak nothing of a tenant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from scheduling.models import GPU, Task, TaskAttempt
from tenants import services as tenant_services
from tenants.models import ApiToken, Membership, Quota, Role
from tests.api.conftest import api_client, assert_error_shape, bearer
from tests.factories import AllocationFactory, TaskEventFactory, TaskFactory

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"

TENANT = "tenant"  # any member of the caller's tenant; viewers read only
OPERATOR = "operator"
PUBLIC = "public"

OBJECT = "object"  # one object of the tenant: another tenant gets 404
LIST = "list"  # the tenant's rows: another tenant sees its own only
CALLER = "caller"  # about the caller's own tenant (me, quota, usage)
CLUSTER = "cluster"  # the shared estate (nodes, GPUs, pools): no tenant's data in it


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # formatted with World.ids
    access: str
    scope: str = ""
    ok: int = 200
    body: dict[str, Any] | None = None
    viewer: int | None = None  # what a viewer gets when it may write here (its own tokens)

    def __str__(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def writes(self) -> bool:
        return self.method not in ("GET", "HEAD", "OPTIONS")


def _e(method, path, access, scope="", ok=200, body=None, viewer=None) -> Endpoint:
    return Endpoint(method, API + path, access, scope, ok, body, viewer)


TASK_BODY = {"name": "new-run", "command": "python train.py"}
MATRIX = [
    # tenants.api_urls
    _e("GET", "me/", TENANT, CALLER),
    _e("GET", "tokens/", TENANT, LIST),
    # A token acts with its owner's role: viewers may create and revoke their own.
    _e("POST", "tokens/", TENANT, LIST, 201, {"name": "ci"}, viewer=201),
    _e("DELETE", "tokens/{token}/", TENANT, OBJECT, 204, viewer=404),  # a teammate's token
    _e("GET", "quota/", TENANT, CALLER),
    _e("GET", "usage/", TENANT, CALLER),
    _e("GET", "operator/tenants/", OPERATOR),
    _e("POST", "operator/tenants/", OPERATOR, ok=201, body={"name": "speech-lab"}),
    _e("GET", "operator/tenants/vision-lab/", OPERATOR),
    _e("PUT", "operator/tenants/vision-lab/", OPERATOR, body={"name": "vision-lab"}),
    _e("PATCH", "operator/tenants/vision-lab/", OPERATOR, body={"display_name": "Vision"}),
    _e("GET", "operator/tenants/vision-lab/members/", OPERATOR),
    _e(
        "POST",
        "operator/tenants/vision-lab/members/",
        OPERATOR,
        ok=201,
        body={"username": "charlie", "role": "viewer"},
    ),
    _e("GET", "operator/quotas/", OPERATOR),
    _e("POST", "operator/quotas/", OPERATOR, ok=201, body={"tenant": "nlp-lab", "max_gpus": 2}),
    _e("GET", "operator/quotas/{quota}/", OPERATOR),
    _e("PUT", "operator/quotas/{quota}/", OPERATOR, body={"tenant": "vision-lab", "max_gpus": 3}),
    _e("PATCH", "operator/quotas/{quota}/", OPERATOR, body={"max_gpus": 3}),
    _e("DELETE", "operator/quotas/{quota}/", OPERATOR, ok=204),
    # scheduling.api_urls
    _e("GET", "tasks/", TENANT, LIST),
    _e("POST", "tasks/", TENANT, LIST, 201, TASK_BODY),
    _e("GET", "tasks/{running}/", TENANT, OBJECT),
    _e("GET", "tasks/{running}/events/", TENANT, OBJECT),
    _e("GET", "tasks/{running}/log/", TENANT, OBJECT),
    _e("POST", "tasks/{pending}/cancel/", TENANT, OBJECT),
    _e("POST", "tasks/{running}/pause/", TENANT, OBJECT),
    _e("POST", "tasks/{paused}/resume/", TENANT, OBJECT),
    _e("POST", "tasks/{failed}/retry/", TENANT, OBJECT),
    _e("GET", "nodes/", TENANT, CLUSTER),
    _e("GET", "gpus/", TENANT, CLUSTER),
    _e("GET", "pools/", TENANT, CLUSTER),
    _e("GET", "operator/tasks/", OPERATOR),
    _e("POST", "operator/gpus/{gpu}/drain/", OPERATOR),
    _e("POST", "operator/gpus/{gpu}/undrain/", OPERATOR),
    _e("POST", "operator/nodes/workstation-1/drain/", OPERATOR),
    _e("POST", "operator/nodes/workstation-1/undrain/", OPERATOR),
    # gpuplatform.urls
    _e("GET", "", PUBLIC),  # the index of resources
    _e("GET", "schema/", PUBLIC),
    _e("GET", "docs/", PUBLIC),
]
PLACEHOLDERS = {"token": 1, "quota": 1, "running": 1, "pending": 1, "paused": 1, "failed": 1}
PLACEHOLDERS["gpu"] = 1

TENANT_ENDPOINTS = [e for e in MATRIX if e.access == TENANT]
OPERATOR_ENDPOINTS = [e for e in MATRIX if e.access == OPERATOR]


def _by_id(endpoints):
    return pytest.mark.parametrize("endpoint", endpoints, ids=str)


# --- The URLconf and the matrix agree ------------------------------------------------------------


def api_endpoints() -> set[tuple[str, str]]:
    """Every (route, method) served under /api/v1/, from the resolver."""
    found: set[tuple[str, str]] = set()

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith(API.lstrip("/")):
                view = pattern.callback.view_class
                for method in view.http_method_names:
                    if method not in ("head", "options") and hasattr(view, method):
                        found.add((route, method.upper()))

    walk(get_resolver().url_patterns, "")
    return found


def test_every_api_endpoint_is_in_the_matrix():
    covered = {(resolve(e.path.format(**PLACEHOLDERS)).route, e.method) for e in MATRIX}
    served = api_endpoints()
    assert served - covered == set(), "endpoints without a row in MATRIX"
    assert covered - served == set(), "rows in MATRIX for endpoints that do not exist"
    assert len(MATRIX) == len(covered), "a row appears twice"


# --- The world every case runs in --------------------------------------------------------------


@dataclass
class World:
    ids: dict[str, Any]
    actors: dict[str, Any]
    # What only the vision lab may ever see: its task names, users, tokens, log text.
    secrets: list[str] = field(default_factory=list)

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.path.format(**self.ids)

    def call(self, actor: str | None, endpoint: Endpoint):
        client = bearer(self.actors[actor].token) if actor else api_client()
        method = getattr(client, endpoint.method.lower())
        return method(self.url(endpoint), endpoint.body, format="json")


def lab_state(lab) -> tuple:
    """Everything a denied request must leave as it was."""
    tasks = sorted(Task.objects.filter(tenant=lab).values_list("id", "state", "reason"))
    tokens = sorted(ApiToken.objects.filter(tenant=lab).values_list("id", "name", "revoked_at"))
    return tasks, tokens, ApiToken.objects.count(), Task.objects.count()


@pytest.fixture
def world(owner, teammate, outsider, viewer, operator, workstation, tmp_path) -> World:
    lab = owner.tenant
    gpus = list(GPU.objects.filter(node=workstation).order_by("index"))

    def task(name, state, **kwargs):
        return TaskFactory(tenant=lab, owner=owner.user, name=name, state=state, **kwargs)

    pending = task("alice-secret-pending", "pending")
    running = task("alice-secret-running", "running", node=workstation, attempt=1)
    paused = task("alice-secret-paused", "paused", node=workstation, attempt=1)
    failed = task("alice-secret-failed", "failed", exit_code=1)
    AllocationFactory(task=running, gpu=gpus[0], memory_mb=gpus[0].memory_mb, exclusive=True)
    TaskEventFactory(task=running, reason="alice-secret placed")
    log = tmp_path / "attempt-1.log"
    log.write_text("alice-secret log line\n")
    TaskAttempt.objects.create(task=running, number=1, node=workstation, log_path=str(log))
    TaskFactory(tenant=outsider.tenant, owner=outsider.user, name="charlie-own-run")
    spare, _ = tenant_services.apitoken_create(user=teammate.user, tenant=lab, name="spare")
    quota = Quota.objects.create(tenant=lab, max_gpus=4)
    lab_prefixes = list(ApiToken.objects.filter(tenant=lab).values_list("prefix", flat=True))
    return World(
        ids={
            "pending": pending.pk,
            "running": running.pk,
            "paused": paused.pk,
            "failed": failed.pk,
            "token": spare.pk,
            "quota": quota.pk,
            "gpu": gpus[1].pk,
        },
        actors={
            "owner": owner,
            "teammate": teammate,
            "outsider": outsider,
            "viewer": viewer,
            "operator": operator,
        },
        # (Short usernames like "bob" could turn up by chance inside a random token.)
        secrets=["alice", "vision-lab", *lab_prefixes],
    )


def assert_no_foreign_data(response, world: World) -> None:
    text = response.content.decode()
    leaked = [secret for secret in world.secrets if secret in text]
    assert leaked == [], f"the outsider saw {leaked}: {text[:500]}"


# --- Each endpoint, each actor ---------------------------------------------------------------
#
# One test per endpoint walks every actor in turn (denied ones first, so nothing they might
# have changed hides from the allowed one): the matrix stays one row per endpoint and the suite
# stays fast.


def check_anonymous(world: World, endpoint: Endpoint) -> None:
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    response = world.call(None, endpoint)
    assert_error_shape(response, 401)
    assert response["WWW-Authenticate"] == "Bearer"
    assert lab_state(lab) == before


def check_outsider(world: World, endpoint: Endpoint) -> None:
    """Another tenant's member: 404 on the lab's objects, its own rows in lists, never a trace
    of the lab in any body."""
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    response = world.call("outsider", endpoint)
    assert_no_foreign_data(response, world)
    if endpoint.scope == OBJECT:
        body = assert_error_shape(response, 404)
        assert body["detail"] == "not found"
        assert lab_state(lab) == before
        return
    assert response.status_code == endpoint.ok, response.content[:500]
    if endpoint.writes:  # creates in its own tenant
        assert lab_state(lab)[:2] == before[:2]
        return
    body = response.json()
    if endpoint.path.endswith("/tasks/"):
        assert [t["name"] for t in body["results"]] == ["charlie-own-run"]
    if endpoint.path.endswith("/tokens/"):
        assert [t["tenant"] for t in body["results"]] == ["nlp-lab"]
    if endpoint.path.endswith("/gpus/"):
        assert body["count"] == 4
        assert all(gpu["my_tasks"] == [] for gpu in body["results"])
    if endpoint.scope == CALLER and "tenant" in body:
        assert body["tenant"] == "nlp-lab"


def check_viewer(world: World, endpoint: Endpoint) -> None:
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    response = world.call("viewer", endpoint)
    if not endpoint.writes:
        assert response.status_code == 200, response.content[:500]
        return
    if endpoint.viewer is not None:
        assert response.status_code == endpoint.viewer, response.content[:500]
        return
    body = assert_error_shape(response, 403)
    assert "may only read" in body["detail"]
    assert lab_state(lab) == before


def check_member(world: World, endpoint: Endpoint) -> None:
    response = world.call("teammate", endpoint)
    assert response.status_code == endpoint.ok, response.content[:500]
    if endpoint.ok == 201 and endpoint.path.endswith("/tasks/"):
        assert Task.objects.filter(name="new-run", tenant=world.actors["owner"].tenant).exists()


@_by_id(TENANT_ENDPOINTS)
def test_a_tenant_endpoint_answers_anonymous_outsider_viewer_and_member(world, endpoint):
    check_anonymous(world, endpoint)
    check_outsider(world, endpoint)
    check_viewer(world, endpoint)
    check_member(world, endpoint)


@_by_id(OPERATOR_ENDPOINTS)
def test_an_operator_endpoint_refuses_everyone_but_operators(world, endpoint):
    check_anonymous(world, endpoint)
    for actor in ("owner", "teammate", "viewer", "outsider"):
        response = world.call(actor, endpoint)
        body = assert_error_shape(response, 403)
        assert body["detail"] == "operators only", actor
    response = world.call("operator", endpoint)
    assert response.status_code == endpoint.ok, response.content[:500]


@_by_id([e for e in MATRIX if e.access == PUBLIC])
def test_the_schema_and_docs_are_public_and_hold_no_tenant_data(world, endpoint):
    response = world.call(None, endpoint)
    assert response.status_code == 200
    assert_no_foreign_data(response, world)


def test_the_schema_documents_every_endpoint(db):
    response = api_client().get(f"{API}schema/", {"format": "json"})
    assert response.status_code == 200
    documented = {
        (re.sub(r"\{\w+\}", "{}", path), method.upper())
        for path, operations in response.json()["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    }
    served = {
        (re.sub(r"<\w+:\w+>", "{}", "/" + route), method)
        for route, method in api_endpoints()
        if not route.startswith(("api/v1/schema/", "api/v1/docs/"))
    }
    assert served - documented == set()


def test_operators_see_every_tenants_tasks(world):
    response = world.call("operator", _e("GET", "operator/tasks/", OPERATOR))
    names = {task["name"] for task in response.json()["results"]}
    assert {"alice-secret-pending", "charlie-own-run"} <= names


# --- Browser sessions choose their tenant ---------------------------------------------------------


def test_a_session_user_in_several_tenants_must_name_one(world):
    bob = world.actors["teammate"].user
    Membership.objects.create(user=bob, tenant=world.actors["outsider"].tenant, role=Role.MEMBER)
    client = api_client()
    client.force_login(bob)
    assert_error_shape(client.get(f"{API}tasks/"), 400, "tenant")
    response = client.get(f"{API}tasks/", HTTP_X_TENANT="vision-lab")
    assert response.status_code == 200
    assert "charlie-own-run" not in response.content.decode()
    response = client.get(f"{API}tasks/", {"tenant": "nlp-lab"})
    assert [t["name"] for t in response.json()["results"]] == ["charlie-own-run"]
    assert_error_shape(client.get(f"{API}tasks/", HTTP_X_TENANT="ops"), 403)
