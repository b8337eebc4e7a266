"""Tenants are created only through tenants.services.tenant_create: by an operator in the
Django admin and through the operators' API alike."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tenants import services
from tenants.models import Tenant
from tests.factories import UserFactory

WANTED = {"name": "speech-lab", "display_name": "Speech lab", "description": "ASR",
          "is_active": False, "unix_user": "speech"}  # fmt: skip


@pytest.fixture
def created(monkeypatch) -> list[dict]:
    """What tenant_create was asked for."""
    calls: list[dict] = []
    real = services.tenant_create

    def spy(**fields):
        calls.append(fields)
        return real(**fields)

    monkeypatch.setattr(services, "tenant_create", spy)
    return calls


@pytest.fixture
def operator_client(db, client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def create_in_admin(client) -> None:
    inlines = {f"{p}-{k}": 0 for p in ("memberships", "quotas")
               for k in ("TOTAL_FORMS", "INITIAL_FORMS")}  # fmt: skip
    form = {**inlines, **{k: v for k, v in WANTED.items() if k != "is_active"}}  # unticked box
    response = client.post(reverse("admin:tenants_tenant_add"), form)
    assert response.status_code == 302, response.content.decode()[:2000]


def create_in_api(client) -> None:
    response = client.post("/api/v1/operator/tenants/", WANTED, content_type="application/json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("create", [create_in_admin, create_in_api], ids=["admin", "api"])
def test_a_new_tenant_is_made_by_the_service(operator_client, created, create):
    create(operator_client)

    assert created == [WANTED]
    tenant = Tenant.objects.get(name="speech-lab")
    assert {field: getattr(tenant, field) for field in WANTED} == WANTED


def test_the_admin_adds_members_and_quotas_to_the_tenant_it_just_made(operator_client, owner):
    form = {"name": "speech-lab", "is_active": "on",
            "memberships-TOTAL_FORMS": 1, "memberships-INITIAL_FORMS": 0,
            "memberships-0-user": owner.user.pk, "memberships-0-role": "admin",
            "quotas-TOTAL_FORMS": 1, "quotas-INITIAL_FORMS": 0, "quotas-0-max_gpus": 2,
            "quotas-0-max_priority": 100, "quotas-0-fair_share_weight": 1}  # fmt: skip

    response = operator_client.post(reverse("admin:tenants_tenant_add"), form)

    assert response.status_code == 302, response.content.decode()[:2000]
    tenant = Tenant.objects.get(name="speech-lab")
    assert list(tenant.memberships.values_list("user__username", "role")) == [("alice", "admin")]
    assert list(tenant.quotas.values_list("max_gpus", flat=True)) == [2]


def test_tenant_create_checks_the_model_s_rules(db):
    with pytest.raises(ValidationError) as refused:
        services.tenant_create(name="Speech Lab", unix_user="root")

    assert set(refused.value.message_dict) == {"name", "unix_user"}
    assert not Tenant.objects.exists()
