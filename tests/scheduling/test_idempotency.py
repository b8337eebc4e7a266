"""The idempotency claim/record pair (scheduling.idempotency), and the submission API using it:
a key recorded through the services is what the API replays, and a key the API used is what
the services find."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from scheduling.idempotency import Earlier, KeyReused, idempotency_claim, idempotency_record
from scheduling.models import IdempotencyKey, Task
from tests.api.conftest import bearer

TASKS = "/api/v1/tasks/"
BODY = json.dumps({"name": "train", "command": "python train.py"})


def test_a_new_key_is_claimed_and_its_answer_recorded(lab):
    assert idempotency_claim(tenant=lab, key="k1", body=b"{}") is None

    idempotency_record(tenant=lab, key="k1", status=201, response=[{"id": 7}])

    assert idempotency_claim(tenant=lab, key="k1", body=b"{}") == Earlier(201, [{"id": 7}])


def test_a_key_used_with_another_body_is_refused(lab):
    idempotency_claim(tenant=lab, key="k1", body=b"{}")

    with pytest.raises(KeyReused, match="already used for a different request"):
        idempotency_claim(tenant=lab, key="k1", body=b"[]")


def test_keys_belong_to_one_tenant(lab, outsider):
    idempotency_claim(tenant=lab, key="k1", body=b"{}")

    assert idempotency_claim(tenant=outsider.tenant, key="k1", body=b"{}") is None
    assert IdempotencyKey.objects.filter(key="k1").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_claim_outside_the_work_s_transaction_is_a_bug(lab):
    with pytest.raises(RuntimeError, match="transaction"):
        idempotency_claim(tenant=lab, key="k1", body=b"{}")
    with transaction.atomic():
        assert idempotency_claim(tenant=lab, key="k1", body=b"{}") is None


def test_the_api_replays_what_the_services_recorded(owner, workstation):
    idempotency_claim(tenant=owner.tenant, key="k1", body=BODY.encode())
    idempotency_record(tenant=owner.tenant, key="k1", status=201, response=[{"id": 42}])

    response = bearer(owner.token).post(
        TASKS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1"
    )

    assert response.status_code == 201
    assert response["Idempotent-Replayed"] == "true"
    assert response.json() == [{"id": 42}]
    assert not Task.objects.exists()


def test_the_services_find_what_the_api_claimed_and_recorded(owner, workstation):
    first = bearer(owner.token).post(
        TASKS, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert first.status_code == 201, first.content

    earlier = idempotency_claim(tenant=owner.tenant, key="k1", body=BODY.encode())

    assert earlier == Earlier(201, first.json())
    with pytest.raises(KeyReused):
        idempotency_claim(tenant=owner.tenant, key="k1", body=b"{}")
