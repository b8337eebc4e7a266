"""Liveness never touches the database; readiness (and /healthz, its older name) does, and
answers 503 with a reason while the database fails. (tests/test_database_outage.py stops a
real PostgreSQL; these cover the answers in-process.)"""

import pytest
from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper


@pytest.fixture
def database_down(monkeypatch):
    def refuse(self):
        raise OperationalError("connection refused")

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)
    monkeypatch.setattr(BaseDatabaseWrapper, "is_usable", lambda self: False)


def test_liveness_answers_without_touching_the_database(client):
    # No django_db mark: any query would raise "Database access not allowed".
    response = client.get("/livez")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.django_db
def test_readiness_reports_the_database(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "detail": "ready", "checks": {"database": "ok"}}


@pytest.mark.django_db
def test_healthz_says_which_nodes_do_not_isolate_tenants(client):
    from scheduling.agentapi.messages import SINGLE_USER_NOTE
    from tests.factories import NodeFactory

    NodeFactory(name="gpu-01", isolation="tenant users")
    NodeFactory(name="laptop", isolation=SINGLE_USER_NOTE)
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["checks"] == {"database": "ok"}
    assert body["isolation"] == {"gpu-01": "tenant users", "laptop": SINGLE_USER_NOTE}
    assert body["warnings"] == [
        "node laptop: single-user mode: tenants are not isolated on this host"
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/readyz", "/healthz"])
def test_readiness_fails_while_the_database_is_down(client, database_down, path):
    response = client.get(path)
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "unreachable"}
    assert response["Retry-After"] == "5"


@pytest.mark.django_db(transaction=True)
def test_liveness_holds_while_the_database_is_down(client, database_down):
    assert client.get("/livez").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_503_json_while_the_database_is_down(client, owner, database_down):
    response = client.get("/api/v1/me/", headers={"Authorization": f"Bearer {owner.token}"})
    assert response.status_code == 503
    assert response.json() == {"detail": "the database is unreachable; retry later", "errors": {}}
    assert response["Retry-After"] == "5"


@pytest.mark.django_db(transaction=True)
def test_other_pages_answer_a_plain_503_while_the_database_is_down(client, database_down):
    client.raise_request_exception = False
    client.cookies["sessionid"] = "abcdefgh12345678"
    response = client.get("/admin/")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/plain")
    assert response["Retry-After"] == "5"
