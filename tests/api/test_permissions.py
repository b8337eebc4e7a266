"""Who may call what, over every endpoint and method under /api/v1/, for every role.

The matrix below must name every (route, method) the URLconf serves under /api/v1/:
``test_every_api_endpoint_is_in_the_matrix`` enumerates them from the resolver, so a new
endpoint without a row here fails the suite. Each row states which tenant roles it allows
(the role matrix in docs/api.md; enforced by ``tenants.roles``), written out here rather than
read from that module, so the two check each other.

Actors: anonymous (401), the outsider (charlie, a member of another tenant: 404 on the lab's
objects, its own rows in lists; erin, that tenant's admin, for the admins' endpoints), a viewer
(dave), a plain member (bob), the tenant admin (alice) and an operator (olga, staff). Task
controls are tried by the member on a teammate's task (403) and on its own (allowed), and by the
admin on the member's task (allowed).

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
from django.utils import timezone

from monitoring.models import Alert
from scheduling.models import GPU, Task, TaskAttempt
from telemetry.models import GpuSample
from tenants import services as tenant_services
from tenants.models import ApiToken, Membership, Quota, Role
from tests.api.conftest import api_client, assert_error_shape, bearer, make_actor
from tests.factories import AllocationFactory, TaskEventFactory, TaskFactory

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"

TENANT = "tenant"  # a member of the caller's tenant, in one of the row's roles
OPERATOR = "operator"
PUBLIC = "public"

OBJECT = "object"  # one object of the tenant: another tenant gets 404
LIST = "list"  # the tenant's rows: another tenant sees its own only
CALLER = "caller"  # about the caller's own tenant (me, quota, usage)
CLUSTER = "cluster"  # the shared estate (nodes, GPUs, pools): no tenant's data in it
CONTROL = "control"  # a task control: a member's own task only, an admin's any

# Which tenant roles a row allows.
READERS = ("viewer", "member", "admin")
WRITERS = ("member", "admin")
ADMINS = ("admin",)
ACTOR_OF = {"viewer": "viewer", "member": "teammate", "admin": "owner"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # formatted with World.ids (and, for task paths, one actor's task ids)
    access: str
    scope: str = ""
    ok: int = 200
    body: dict[str, Any] | None = None
    roles: tuple[str, ...] = READERS
    # What a role gets where the object itself is not its own (a teammate's token): 404.
    codes: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def writes(self) -> bool:
        return self.method not in ("GET", "HEAD", "OPTIONS")

    def expected(self, role: str) -> int:
        if role in self.codes:
            return self.codes[role]
        return self.ok if role in self.roles else 403


def _e(method, path, access, scope="", ok=200, body=None, roles=READERS, codes=None) -> Endpoint:
    return Endpoint(method, API + path, access, scope, ok, body, roles, codes or {})


TASK_BODY = {"name": "new-run", "command": "python train.py"}
MATRIX = [
    # tenants.api_urls
    _e("GET", "me/", TENANT, CALLER),
    _e("GET", "tokens/", TENANT, LIST),
    # A token acts with its owner's role: viewers may create and revoke their own.
    _e("POST", "tokens/", TENANT, LIST, 201, {"name": "ci"}),
    # The member's spare token: only the member itself revokes it here (admins: tenant/tokens/).
    _e("DELETE", "tokens/{token}/", TENANT, OBJECT, 204, codes={"viewer": 404, "admin": 404}),
    _e("GET", "quota/", TENANT, CALLER, roles=ADMINS),
    _e("GET", "usage/", TENANT, CALLER),
    _e("GET", "tenant/members/", TENANT, LIST, roles=ADMINS),
    _e(
        "POST",
        "tenant/members/",
        TENANT,
        LIST,
        201,
        {"username": "charlie", "role": "viewer"},
        roles=ADMINS,
    ),
    _e("GET", "tenant/members/{member}/", TENANT, OBJECT, roles=ADMINS),
    _e("PATCH", "tenant/members/{member}/", TENANT, OBJECT, body={"role": "viewer"}, roles=ADMINS),
    _e("DELETE", "tenant/members/{member}/", TENANT, OBJECT, 204, roles=ADMINS),
    _e("GET", "tenant/tokens/", TENANT, LIST, roles=ADMINS),
    _e("DELETE", "tenant/tokens/{token}/", TENANT, OBJECT, 204, roles=ADMINS),
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
    _e("POST", "tasks/", TENANT, LIST, 201, TASK_BODY, roles=WRITERS),
    _e("GET", "tasks/{running}/", TENANT, OBJECT),
    _e("GET", "tasks/{running}/events/", TENANT, OBJECT),
    _e("GET", "tasks/{running}/log/", TENANT, OBJECT),
    _e("POST", "tasks/{pending}/cancel/", TENANT, CONTROL, roles=WRITERS),
    _e("POST", "tasks/{running}/pause/", TENANT, CONTROL, roles=WRITERS),
    _e("POST", "tasks/{paused}/resume/", TENANT, CONTROL, roles=WRITERS),
    _e("POST", "tasks/{failed}/retry/", TENANT, CONTROL, roles=WRITERS),
    _e("GET", "nodes/", TENANT, CLUSTER),
    _e("GET", "gpus/", TENANT, CLUSTER),
    _e("GET", "pools/", TENANT, CLUSTER),
    _e("GET", "operator/tasks/", OPERATOR),
    # telemetry.api_urls
    _e("GET", "tasks/{running}/metrics/", TENANT, OBJECT),
    _e("GET", "gpus/live/", TENANT, CLUSTER),
    _e("GET", "usage/sampled/", TENANT, CALLER),
    _e("GET", "operator/tasks/{running}/metrics/", OPERATOR),
    _e("GET", "operator/gpus/{gpu}/metrics/", OPERATOR),
    _e("GET", "operator/nodes/workstation-1/metrics/", OPERATOR),
    _e("GET", "operator/gpus/live/", OPERATOR),
    _e("GET", "operator/usage/sampled/", OPERATOR),
    # monitoring.api_urls
    _e("GET", "alerts/", TENANT, LIST),
    _e("GET", "operator/alerts/", OPERATOR),
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
PLACEHOLDERS.update(gpu=1, member="bob")

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

TASK_STATES = ("pending", "running", "paused", "failed")


@dataclass
class World:
    ids: dict[str, Any]
    # Task ids by state, per whose tasks they are: "alice" (the admin's, which the member may
    # not control), "bob" (the member's own) and "bob-for-admin" (the member's, which the admin
    # controls).
    tasks: dict[str, dict[str, int]]
    actors: dict[str, Any]
    # What only the vision lab may ever see: its task names, users, tokens, log text.
    secrets: list[str] = field(default_factory=list)

    def url(self, endpoint: Endpoint, tasks: str = "alice") -> str:
        return endpoint.path.format(**self.ids, **self.tasks[tasks])

    def call(self, actor: str | None, endpoint: Endpoint, tasks: str = "alice"):
        client = bearer(self.actors[actor].token) if actor else api_client()
        method = getattr(client, endpoint.method.lower())
        return method(self.url(endpoint, tasks), endpoint.body, format="json")


def lab_state(lab) -> tuple:
    """Everything a denied request must leave as it was."""
    tasks = sorted(Task.objects.filter(tenant=lab).values_list("id", "state", "reason"))
    tokens = sorted(ApiToken.objects.filter(tenant=lab).values_list("id", "name", "revoked_at"))
    members = sorted(Membership.objects.filter(tenant=lab).values_list("user__username", "role"))
    return tasks, tokens, members, ApiToken.objects.count(), Task.objects.count()


@pytest.fixture
def world(owner, teammate, outsider, viewer, operator, workstation, tmp_path) -> World:
    lab = owner.tenant
    gpus = list(GPU.objects.filter(node=workstation).order_by("index"))
    erin = make_actor(outsider.tenant, Role.ADMIN, "erin")

    def tasks_of(who, user) -> dict[str, int]:
        made = {}
        for state in TASK_STATES:
            extra = {"node": workstation, "attempt": 1} if state in ("running", "paused") else {}
            if state == "failed":
                extra["exit_code"] = 1
            made[state] = TaskFactory(
                tenant=lab, owner=user, name=f"{who}-secret-{state}", state=state, **extra
            ).pk
        return made

    tasks = {
        "alice": tasks_of("alice", owner.user),
        "bob": tasks_of("bob-own", teammate.user),
        "bob-for-admin": tasks_of("bob-other", teammate.user),
    }
    running = Task.objects.get(pk=tasks["alice"]["running"])
    AllocationFactory(task=running, gpu=gpus[0], memory_mb=gpus[0].memory_mb, exclusive=True)
    TaskEventFactory(task=running, reason="alice-secret placed")
    log = tmp_path / "attempt-1.log"
    log.write_text("alice-secret log line\n")
    TaskAttempt.objects.create(task=running, number=1, node=workstation, log_path=str(log))
    # A sample of the lab's GPU: live views must not show the outsider whose it is.
    GpuSample.objects.create(
        gpu=gpus[0], at=timezone.now(), task=running, tenant=lab, util_gpu=90, simulated=True
    )
    Alert.objects.create(
        kind="gpu_idle", severity="warning", gpu=gpus[0], task=running,
        message="alice-secret-running holds an idle GPU",
    )  # fmt: skip
    TaskFactory(tenant=outsider.tenant, owner=outsider.user, name="charlie-own-run")
    spare, _ = tenant_services.apitoken_create(user=teammate.user, tenant=lab, name="spare")
    quota = Quota.objects.create(tenant=lab, max_gpus=4)
    lab_prefixes = list(ApiToken.objects.filter(tenant=lab).values_list("prefix", flat=True))
    return World(
        ids={"token": spare.pk, "quota": quota.pk, "gpu": gpus[1].pk, "member": "bob"},
        tasks=tasks,
        actors={
            "owner": owner,
            "teammate": teammate,
            "outsider": outsider,
            "outsider-admin": erin,
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
# have changed hides from the allowed ones): the matrix stays one row per endpoint and the
# suite stays fast.


def check_anonymous(world: World, endpoint: Endpoint) -> None:
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    response = world.call(None, endpoint)
    assert_error_shape(response, 401)
    assert response["WWW-Authenticate"] == "Bearer"
    assert lab_state(lab) == before


def check_outsider(world: World, endpoint: Endpoint) -> None:
    """Another tenant's member, in a role its own tenant allows here: 404 on the lab's objects,
    its own rows in lists, never a trace of the lab in any body."""
    lab = world.actors["owner"].tenant
    actor = "outsider-admin" if endpoint.roles == ADMINS else "outsider"
    before = lab_state(lab)
    response = world.call(actor, endpoint)
    assert_no_foreign_data(response, world)
    if endpoint.scope in (OBJECT, CONTROL):
        body = assert_error_shape(response, 404)
        assert body["detail"] == "not found"
        assert lab_state(lab) == before
        return
    assert response.status_code == endpoint.ok, response.content[:500]
    if endpoint.writes:  # creates in its own tenant
        assert lab_state(lab)[:3] == before[:3]
        return
    body = response.json()
    if endpoint.path.endswith("/tasks/"):
        assert [t["name"] for t in body["results"]] == ["charlie-own-run"]
    if endpoint.path.endswith("/tokens/"):
        assert {t["tenant"] for t in body["results"]} == {"nlp-lab"}
    if endpoint.path.endswith("/members/"):
        assert sorted(m["username"] for m in body["results"]) == ["charlie", "erin"]
    if endpoint.path.endswith("/alerts/"):
        assert body["results"] == []
    if endpoint.path.endswith("/gpus/live/"):
        assert [g["tenant"] for g in body] == ["another tenant", None, None, None]
        assert all(g.get("task") is None for g in body)
    if endpoint.path.endswith("/gpus/"):
        assert body["count"] == 4
        assert all(gpu["my_tasks"] == [] for gpu in body["results"])
    if endpoint.scope == CALLER and "tenant" in body:
        assert body["tenant"] == "nlp-lab"


def check_role(world: World, endpoint: Endpoint, role: str) -> None:
    """One tenant role on one (non-control) endpoint: the row's answer, and a refusal that
    says why and changes nothing."""
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    response = world.call(ACTOR_OF[role], endpoint)
    expected = endpoint.expected(role)
    if expected == 403:
        body = assert_error_shape(response, 403)
        why = "only the tenant's admins" if endpoint.roles == ADMINS else "may only read"
        assert why in body["detail"], (role, body)
    elif expected == 404:
        assert_error_shape(response, 404)
    else:
        assert response.status_code == expected, (role, response.content[:500])
        if endpoint.ok == 201 and endpoint.path.endswith("/tasks/"):
            assert Task.objects.filter(name="new-run", tenant=lab).exists()
        return
    assert lab_state(lab) == before, role


def check_control(world: World, endpoint: Endpoint) -> None:
    """Viewers control nothing; a member controls its own tasks, not a teammate's; the admin
    controls every task of the tenant."""
    lab = world.actors["owner"].tenant
    before = lab_state(lab)
    body = assert_error_shape(world.call("viewer", endpoint, tasks="bob"), 403)
    assert "may only read" in body["detail"]
    body = assert_error_shape(world.call("teammate", endpoint, tasks="alice"), 403)
    assert "only its own tasks" in body["detail"]
    assert lab_state(lab) == before
    response = world.call("teammate", endpoint, tasks="bob")
    assert response.status_code == endpoint.ok, response.content[:500]
    response = world.call("owner", endpoint, tasks="bob-for-admin")
    assert response.status_code == endpoint.ok, response.content[:500]


@_by_id(TENANT_ENDPOINTS)
def test_a_tenant_endpoint_answers_every_role_as_the_matrix_says(world, endpoint):
    check_anonymous(world, endpoint)
    check_outsider(world, endpoint)
    if endpoint.scope == CONTROL:
        check_control(world, endpoint)
        return
    # Refused roles first: what an allowed one changed must not hide a refused one's change.
    for role in sorted(READERS, key=lambda r: endpoint.expected(r) < 400):
        check_role(world, endpoint, role)


def test_the_matrix_gives_admins_what_members_have_and_members_what_viewers_have():
    """Sanity of the matrix itself: an admin may do whatever a member may, a member whatever a
    viewer may."""
    for endpoint in TENANT_ENDPOINTS:
        allowed = [role in endpoint.roles for role in READERS]
        assert allowed == sorted(allowed), endpoint


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
