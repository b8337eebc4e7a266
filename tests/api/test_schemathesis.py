"""Property-based tests of REST API v1 against its own OpenAPI schema, with schemathesis.

The schema is fetched from ``/api/v1/schema/`` through the WSGI application, and every operation
in it is called in-process through that same application with requests generated from the
schema, valid ones and invalid ones. For each response:

- ``not_a_server_error``: never a 5xx, whatever the client sends;
- ``response_schema_conformance`` and ``content_type_conformance``: a documented status code
  answers the documented content type and body;
- ``documented_status_or_uniform_error`` (below, in place of ``status_code_conformance``): any
  other status is one of the 4xx the API answers, with the one error body every 4xx has;
- ``ignored_auth``: an operation that succeeded with the token refuses the same request without
  it and with a wrong one.

Every method on every path, not just the documented ones: the same generated requests sent with
each method the schema does not list for their path answer 405 with ``Allow`` (404 for a path
object the caller's tenant does not have, 400 for a path id past bigint), never a 5xx.

Tenant endpoints run with a tenant admin's token, operator endpoints with an operator's. Two
smaller runs check that every operation answers 401 without valid credentials and that operator
endpoints answer 403 to a tenant admin.

Each test runs inside its test's transaction, as Django's test client does: requests are served
in-process by the same thread, on the same connection, so they see the test's rows and the
rollback undoes what they wrote. Commit hooks (scheduling passes) run after each request.

Bounded and repeatable: fuzzing phase only (the coverage phase is unbounded: about 2,100 cases
here), 20 cases per operation, a fixed seed and no example database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core import signals
from django.core.cache import cache
from django.core.management.color import no_style
from django.db import close_old_connections, connection
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from gpuplatform.wsgi import application
from scheduling.models import GPU, Node, Pool, Task
from scheduling.spec import parse_specs
from scheduling.submission import tasks_submit
from tenants import services as tenant_services
from tenants.models import ApiToken, Membership, Quota, Role, Tenant
from tests.factories import (
    NodeFactory,
    QuotaFactory,
    TaskFactory,
    TenantFactory,
    UserFactory,
    make_gpus,
)

SCHEMA_URL = "/api/v1/schema/"
OPERATOR_PATHS = r"^/api/v1/operator/"
# The schema and the Swagger UI page are not JSON operations (drf-spectacular leaves them out).
NOT_OPERATIONS = r"^/api/v1/(docs|schema)/"
# The index of resources answers anyone (a bad token still gets 401): tests/api/test_api_index.py.
PUBLIC_OPERATIONS = r"^/api/v1/$"
BAD_TOKEN = "gpup_AAAAAAAA_" + "x" * 40

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": 20260613,
        # Values that break servers more often than random ones do, mixed into what is drawn.
        "dictionaries": {
            "hostile-strings": {
                "values": ["\x00", "a\x00b", "", " ", "%", "..", "../../etc/passwd", "ǅ²", "\u202e"]
            },
            "edge-integers": {"values": [0, 1, 2, -1, 2**31 - 1, 2**31, 2**63, -(2**63) - 1]},
        },
        "generation": {
            "mode": "all",
            "max-examples": 20,
            "database": "none",
            # Credentials come from the test (a real token, none, or a wrong one), not the fuzzer.
            "with-security-parameters": False,
            "dictionaries": {
                "string": {"dictionary": "hostile-strings", "probability": 0.2},
                "integer": {"dictionary": "edge-integers", "probability": 0.2},
            },
        },
        "phases": {
            "examples": {"enabled": False},
            "coverage": {"enabled": False},
            "stateful": {"enabled": False},
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "ignored_auth": {"enabled": True},
        },
    }
)

schema = schemathesis.openapi.from_wsgi(SCHEMA_URL, application, config=CONFIG).exclude(
    path_regex=NOT_OPERATIONS
)

# Random ids and names almost never name a row, and random bodies never make a valid task or
# quota: the hooks below mix in values naming what the `cluster` fixture made (its sequences
# restart at 1), so the fuzzer reaches the views' work as well as their 404s and 400s.
KNOWN_PATH_VALUES = {
    "id": st.integers(min_value=1, max_value=6),
    "name": st.sampled_from(["vision-lab", "workstation-1"]),
}
KNOWN_BODY_VALUES = {
    "tenant": st.just("vision-lab"),
    "pool": st.sampled_from(["default", None]),
    "username": st.sampled_from(["alice", "olga"]),
}
TASK_SPEC = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True),
        "command": st.sampled_from(["python train.py", "sleep 1"]),
    },
    optional={
        "resources": st.fixed_dictionaries({}, optional={"gpus": st.integers(0, 5)}),
        "priority": st.integers(0, 100),
        "queue": st.sampled_from(["default", "batch"]),
    },
)


def _with_known(values: dict, known: dict) -> st.SearchStrategy:
    if not isinstance(values, dict):
        return st.just(values)
    return st.fixed_dictionaries(
        {key: known[key] if key in known else st.just(value) for key, value in values.items()}
    )


@schema.hook
def before_generate_path_parameters(context, strategy):
    return st.one_of(strategy, strategy.flatmap(lambda v: _with_known(v, KNOWN_PATH_VALUES)))


@schema.hook
def before_generate_body(context, strategy):
    if context.operation.label == "POST /api/v1/tasks/":
        return st.one_of(strategy, TASK_SPEC, st.lists(TASK_SPEC, min_size=1, max_size=3))
    return st.one_of(strategy, strategy.flatmap(lambda v: _with_known(v, KNOWN_BODY_VALUES)))


tenant_schema = schema.exclude(path_regex=OPERATOR_PATHS)
operator_schema = schema.include(path_regex=OPERATOR_PATHS)

# Fixtures are function-scoped on purpose: one set of rows per operation, shared by its cases
# (Caller.restore() puts back what a case did to the caller's own credentials).
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(FUZZ, max_examples=3)


# --- The error answer ----------------------------------------------------------------------------

# What gpuplatform.api.handle_exception (and DRF behind it) answers.
ERROR_STATUSES = {400, 401, 403, 404, 405, 409, 413, 415, 429}


def assert_uniform_error(response) -> None:
    """``{"detail": str, "errors": {field: [reasons]}}`` as JSON, with the headers that go with
    401 (the Bearer challenge) and 429 (Retry-After)."""
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), f"{response.status_code}: {content_type}"
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"detail", "errors"}, body
    assert isinstance(body["detail"], str), body
    assert isinstance(body["errors"], dict), body
    for name, reasons in body["errors"].items():
        assert isinstance(reasons, list) and all(isinstance(r, str) for r in reasons), (name, body)
    if response.status_code == 401:
        assert response.headers.get("www-authenticate") == ["Bearer"], response.headers
    if response.status_code == 429:
        assert "retry-after" in response.headers, response.headers


def routes_to_a_view(response) -> bool:
    """Whether the request's path reaches a view at all. Invalid path parameters (``abc`` for
    an integer id) match no route, and Django, not the API, answers them: a 404 in HTML, before
    any authentication. Accepted here; a JSON ``handler404`` for /api/ would make it uniform."""
    try:
        resolve(unquote(urlsplit(response.request.url).path))
    except Resolver404:
        return False
    return True


def documented_status_or_uniform_error(ctx, response, case):
    """``status_code_conformance``, except for the API's 4xx answers.

    The schema documents only each operation's success status (and 409 for task controls):
    drf-spectacular does not describe what the exception handler answers. Until it does (see
    ``test_every_operation_documents_its_error_answers``), an undocumented status must be one
    of ``ERROR_STATUSES`` and carry the uniform error body.
    """
    documented = case.operation.responses.status_codes
    if str(response.status_code) in documented or "default" in documented:
        return
    if response.status_code == 404 and not routes_to_a_view(response):
        return  # Django's own (HTML) 404: see routes_to_a_view
    assert response.status_code in ERROR_STATUSES, (
        f"undocumented status {response.status_code} (documented: {', '.join(documented)})"
    )
    assert_uniform_error(response)


# --- The world the requests act on ---------------------------------------------------------------


@dataclass
class Caller:
    """A user with an API token in a tenant."""

    user: User
    tenant: Tenant
    token: ApiToken
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    def restore(self) -> None:
        """Undo what earlier cases did to the caller's credentials (revoked the token,
        deactivated the tenant, changed the role) so that every case runs as this caller."""
        ApiToken.objects.filter(pk=self.token.pk).update(revoked_at=None, expires_at=None)
        Tenant.objects.filter(pk=self.tenant.pk).update(is_active=True)
        Membership.objects.update_or_create(
            user=self.user, tenant=self.tenant, defaults={"role": Role.ADMIN}
        )


def make_caller(tenant: Tenant, username: str, *, operator: bool = False) -> Caller:
    user = UserFactory(username=username, is_staff=operator, is_superuser=operator)
    Membership.objects.create(user=user, tenant=tenant, role=Role.ADMIN)
    token, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="fuzz")
    return Caller(user=user, tenant=tenant, token=token, secret=secret)


@pytest.fixture
def in_test_transaction():
    """Serve WSGI requests inside the test's transaction, as Django's test client does: the
    handler otherwise closes the connection at each request's start and end."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def cluster(db, in_test_transaction, settings) -> Tenant:
    """A tenant with a quota and tasks in several states, on a node with 4 GPUs. Sequences
    restart at 1 (safely: at the tables' highest id), so small generated ids find these rows.
    The fuzzer sends far more than a tenant's rate: the throttle is raised out of its way."""
    settings.API_THROTTLE_RATE = settings.API_ANON_THROTTLE_RATE = "1000000/s"
    cache.clear()
    models = [Tenant, User, Membership, ApiToken, Quota, Pool, Node, GPU, Task]
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), models):
            cursor.execute(sql)
    tenant = TenantFactory(name="vision-lab")
    node = NodeFactory(name="workstation-1")
    make_gpus(node, count=4)
    QuotaFactory(tenant=tenant, max_gpus=4)
    specs = parse_specs(
        [
            {"name": f"train-{i}", "command": "python train.py", "resources": {"gpus": 1}}
            for i in (1, 2)
        ]
    )
    tasks_submit(tenant=tenant, specs=specs)
    for state, exit_code in (("succeeded", 0), ("failed", 1), ("cancelled", None)):
        TaskFactory(tenant=tenant, state=state, exit_code=exit_code)
    return tenant


@pytest.fixture
def admin(cluster) -> Caller:
    return make_caller(cluster, "alice")


@pytest.fixture
def operator(cluster) -> Caller:
    return make_caller(cluster, "olga", operator=True)


@pytest.fixture
def call(django_capture_on_commit_callbacks):
    """Call the case as ``caller`` and run every check; commit hooks run after the request."""

    def run(case, caller: Caller) -> None:
        caller.restore()
        with django_capture_on_commit_callbacks(execute=True):
            case.call_and_validate(
                headers=caller.headers, additional_checks=[documented_status_or_uniform_error]
            )

    return run


# --- Tests ---------------------------------------------------------------------------------------


@tenant_schema.parametrize()
@FUZZ
@pytest.mark.django_db
def test_tenant_api_conforms_to_its_schema(case, admin, call):
    call(case, admin)


@operator_schema.parametrize()
@FUZZ
@pytest.mark.django_db
def test_operator_api_conforms_to_its_schema(case, operator, call):
    call(case, operator)


@schema.exclude(path_regex=PUBLIC_OPERATIONS).parametrize()
@FEW
@pytest.mark.django_db
def test_every_operation_refuses_requests_without_valid_credentials(case, cluster):
    for headers in ({}, {"Authorization": f"Bearer {BAD_TOKEN}"}):
        response = case.call(headers=headers)
        case.validate_response(
            response, checks=[not_a_server_error, documented_status_or_uniform_error]
        )
        expected = 401 if routes_to_a_view(response) else 404
        assert response.status_code == expected, (headers, response.status_code, response.content)


@operator_schema.parametrize()
@FEW
@pytest.mark.django_db
def test_operator_endpoints_refuse_a_tenant_admin(case, admin):
    admin.restore()
    response = case.call(headers=admin.headers)
    case.validate_response(
        response, checks=[not_a_server_error, documented_status_or_uniform_error]
    )
    expected = 403 if routes_to_a_view(response) else 404
    assert response.status_code == expected, (response.status_code, response.content)


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def undocumented_methods() -> list[tuple[str, list[str]]]:
    """Each path of the schema with the methods it does not document."""
    paths = []
    for path, operations in schema.raw_schema["paths"].items():
        if re.match(NOT_OPERATIONS, path):
            continue
        documented = {method.upper() for method in operations}
        paths.append((path, [method for method in METHODS if method not in documented]))
    return paths


def assert_refused_method(response, method: str) -> None:
    """A method the path does not document: 405 with Allow; or the view's lookup of the path's
    object (404), or of its id (400), came first; HEAD and OPTIONS may be answered (DRF
    answers them for every view, HEAD where there is a GET)."""
    status = response.status_code
    if status == 200 and method in ("HEAD", "OPTIONS"):
        return
    assert status in (400, 404, 405), (method, response.request.url, status, response.content)
    if status == 404 and not routes_to_a_view(response):
        return  # Django's own (HTML) 404: see routes_to_a_view
    if status == 405:
        assert method not in response.headers.get("allow", [""])[0], response.headers
        assert response.headers.get("allow", [""])[0], response.headers
    if method != "HEAD":
        assert_uniform_error(response)


@pytest.mark.parametrize(("path", "methods"), undocumented_methods())
@FEW
@given(data=st.data())
@pytest.mark.django_db
def test_every_method_a_path_does_not_document_is_refused_without_a_5xx(
    path, methods, data, admin, operator
):
    documented = next(iter(schema[path].values()))
    case = data.draw(documented.as_strategy())
    caller = operator if re.match(OPERATOR_PATHS, path) else admin
    caller.restore()
    for method in methods:
        case.method = method
        response = case.call(headers=caller.headers)
        case.validate_response(response, checks=[not_a_server_error])
        assert_refused_method(response, method)


def test_every_operation_documents_its_error_answers():
    """Every operation needs credentials, so each can answer at least 401."""
    undocumented = [
        operation.label
        for operation in (result.ok() for result in schema.get_all_operations())
        if not {"401", "4XX", "default"} & set(operation.responses.status_codes)
    ]
    assert not undocumented, undocumented
