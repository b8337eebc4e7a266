"""Quotas are saved and removed only through scheduling.quotas: the model's rules are checked
there, and every change queues a scheduling pass (a raised limit may let waiting tasks start).
An operator in the Django admin and one in the API end the same way."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from scheduling import passes
from scheduling.quotas import quota_delete, quota_set
from tenants.models import Quota, Tenant
from tests.factories import PoolFactory, QuotaFactory, UserFactory

QUOTAS = "/api/v1/operator/quotas/"
LIMITS = ("max_gpus", "max_gpu_memory_mb", "max_running_tasks", "max_queued_tasks",
          "max_priority", "fair_share_weight")  # fmt: skip


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def passes_queued(db, monkeypatch):
    """How many times a scheduling pass was asked for (``passes.request_pass``, which queues
    one when the change commits) since the last look."""
    calls: list[object] = []
    monkeypatch.setattr(passes, "request_pass", lambda claimed=None: calls.append(claimed))

    def count() -> int:
        seen = len(calls)
        calls.clear()
        return seen

    return count


@pytest.fixture
def client_(db, client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def form_of(quota: Quota) -> dict:
    """The admin's quota form as it stands, blank limits as empty strings."""
    values = {name: getattr(quota, name) for name in LIMITS}
    return {"tenant": quota.tenant_id, "pool": quota.pool_id or "",
            **{k: "" if v is None else v for k, v in values.items()}}  # fmt: skip


class AdminPath:
    def __init__(self, client):
        self.client = client

    def create(self, tenant: Tenant, **limits) -> None:
        form = form_of(Quota(tenant=tenant, **limits))
        response = self.client.post(admin_url(Quota, "add"), form)
        assert response.status_code == 302, response.content.decode()[:2000]

    def change(self, quota: Quota, **limits) -> None:
        form = {**form_of(quota), **limits}
        response = self.client.post(admin_url(Quota, "change", quota.pk), form)
        assert response.status_code == 302, response.content.decode()[:2000]

    def delete(self, quota: Quota) -> None:
        response = self.client.post(admin_url(Quota, "delete", quota.pk), {"post": "yes"})
        assert response.status_code == 302, response.content.decode()[:2000]


class ApiPath:
    def __init__(self, client):
        self.client = client

    def create(self, tenant: Tenant, **limits) -> None:
        response = self.client.post(QUOTAS, {"tenant": tenant.name, **limits},
                                    content_type="application/json")  # fmt: skip
        assert response.status_code == 201, response.content

    def change(self, quota: Quota, **limits) -> None:
        response = self.client.patch(f"{QUOTAS}{quota.pk}/", limits,
                                     content_type="application/json")  # fmt: skip
        assert response.status_code == 200, response.content

    def delete(self, quota: Quota) -> None:
        assert self.client.delete(f"{QUOTAS}{quota.pk}/").status_code == 204


@pytest.fixture(params=["admin", "api"])
def path(request, client_):
    return AdminPath(client_) if request.param == "admin" else ApiPath(client_)


def test_creating_a_quota_saves_it_and_queues_a_pass(path, lab, passes_queued):
    path.create(lab, max_gpus=4, fair_share_weight=2.0)

    quota = Quota.objects.get()
    assert (quota.tenant, quota.pool, quota.max_gpus, quota.fair_share_weight) == (lab, None, 4, 2)
    assert passes_queued() == 1


def test_changing_a_quota_saves_it_and_queues_a_pass(path, lab, passes_queued):
    quota = QuotaFactory(tenant=lab, max_gpus=4)
    passes_queued()

    path.change(quota, max_gpus=8)

    quota.refresh_from_db()
    assert quota.max_gpus == 8
    assert passes_queued() == 1


def test_removing_a_quota_queues_a_pass(path, lab, passes_queued):
    quota = QuotaFactory(tenant=lab)

    path.delete(quota)

    assert not Quota.objects.exists()
    assert passes_queued() == 1


# --- The admin's other ways to write a quota ---------------------------------------------------


def test_the_bulk_delete_action_removes_through_the_service(client_, lab, passes_queued):
    chosen = [QuotaFactory(tenant=lab).pk, QuotaFactory(tenant=lab, pool=PoolFactory()).pk]
    form = {"action": "delete_selected", "post": "yes", "_selected_action": chosen}

    response = client_.post(admin_url(Quota, "changelist"), form)

    assert response.status_code == 302
    assert not Quota.objects.exists()
    assert passes_queued() == 2  # one request each: passes.request_pass coalesces them


def test_the_tenant_page_s_quota_rows_go_through_the_service(client_, lab, passes_queued):
    removed = QuotaFactory(tenant=lab, pool=PoolFactory(name="training"))
    changed = QuotaFactory(tenant=lab, max_gpus=4)
    rows = [{"id": changed.pk, **form_of(changed), "max_gpus": 6},
            {"id": removed.pk, **form_of(removed), "DELETE": "on"},
            {**form_of(Quota(max_gpus=1)), "pool": PoolFactory(name="debug").pk}]  # fmt: skip
    form = {"name": lab.name, "is_active": "on", "memberships-TOTAL_FORMS": 0,
            "memberships-INITIAL_FORMS": 0, "quotas-TOTAL_FORMS": 3,
            "quotas-INITIAL_FORMS": 2}  # fmt: skip
    for i, row in enumerate(rows):
        form.update({f"quotas-{i}-{key}": value for key, value in row.items()})
        form[f"quotas-{i}-tenant"] = lab.pk

    response = client_.post(admin_url(Tenant, "change", lab.pk), form)

    assert response.status_code == 302, response.content.decode()[:3000]
    left = Quota.objects.order_by("pool__name").values_list("pool__name", "max_gpus")
    assert list(left) == [("debug", 1), (None, 6)]
    assert passes_queued() == 3


# --- The services themselves ---------------------------------------------------------------------


def test_quota_set_checks_the_model_s_rules_whoever_calls(lab, passes_queued):
    QuotaFactory(tenant=lab)

    with pytest.raises(ValidationError) as refused:
        quota_set(quota=Quota(tenant=lab, max_priority=101))

    assert set(refused.value.message_dict) == {"pool", "max_priority"}
    assert Quota.objects.count() == 1
    assert passes_queued() == 0


def test_quota_delete_removes_the_row(lab, passes_queued):
    quota_delete(quota=QuotaFactory(tenant=lab))

    assert not Quota.objects.exists()
    assert passes_queued() == 1
