"""Membership writes go through tenants.services, whoever makes them: an operator in the Django
admin and a tenant admin through the API end the same way. A removed member's tokens in the
tenant are revoked (a re-add does not bring them back), and a tenant keeps its last admin."""

from __future__ import annotations

import pytest
from django.contrib import messages
from django.urls import reverse

from tenants import services
from tenants.models import ApiToken, Membership, Role, Tenant
from tests.api.conftest import bearer
from tests.factories import MembershipFactory, TenantFactory, UserFactory

MEMBERS = "/api/v1/tenant/members/"
NEEDS_AN_ADMIN = "tenant vision-lab needs an admin: make another member admin first"


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def refusal(response) -> str | None:
    """What the admin said no with (an error message or a form error); None when it did it."""
    said = [m.message for m in messages.get_messages(response.wsgi_request)
            if m.level == messages.ERROR]  # fmt: skip
    if said:
        return " ".join(said)
    if response.status_code == 200:  # the form again, with its errors
        form = response.context["adminform"].form
        return " ".join(str(e) for errors in form.errors.values() for e in errors)
    assert response.status_code == 302, response.content.decode()[:2000]
    return None


class AdminPath:
    """An operator (a superuser) posting the Django admin's own forms."""

    def __init__(self, client):
        self.client = client
        client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))

    def add(self, *, user, tenant: Tenant, role: str) -> str | None:
        form = {"user": user.pk, "tenant": tenant.pk, "role": role}
        return refusal(self.client.post(admin_url(Membership, "add"), form))

    def set_role(self, membership: Membership, role: str) -> str | None:
        # user and tenant are sent as today's form had them; the admin must not move the row.
        form = {"user": membership.user_id, "tenant": membership.tenant_id, "role": role}
        return refusal(self.client.post(admin_url(Membership, "change", membership.pk), form))

    def remove(self, membership: Membership) -> str | None:
        url = admin_url(Membership, "delete", membership.pk)
        return refusal(self.client.post(url, {"post": "yes"}))


class ApiPath:
    """The tenant's admin (alice) through /api/v1/tenant/members/."""

    def __init__(self, secret: str):
        self.client = bearer(secret)

    @staticmethod
    def _refusal(response) -> str | None:
        if response.status_code == 409:
            return response.json()["detail"].removeprefix("role: ")
        assert response.status_code in (200, 201, 204), response.content
        return None

    def add(self, *, user, tenant: Tenant, role: str) -> str | None:
        body = {"username": user.username, "role": role}
        return self._refusal(self.client.post(MEMBERS, body, format="json"))

    def set_role(self, membership: Membership, role: str) -> str | None:
        url = f"{MEMBERS}{membership.user.username}/"
        return self._refusal(self.client.patch(url, {"role": role}, format="json"))

    def remove(self, membership: Membership) -> str | None:
        return self._refusal(self.client.delete(f"{MEMBERS}{membership.user.username}/"))


@pytest.fixture(params=["admin", "api"])
def path(request, client, owner):
    return AdminPath(client) if request.param == "admin" else ApiPath(owner.token)


def membership(actor) -> Membership:
    return Membership.objects.get(user=actor.user, tenant=actor.tenant)


def test_removing_a_member_revokes_its_tokens_and_a_re_add_does_not_bring_them_back(
    path, owner, teammate
):
    elsewhere = TenantFactory(name="nlp-lab")
    MembershipFactory(user=teammate.user, tenant=elsewhere)
    _, other_secret = services.apitoken_create(user=teammate.user, tenant=elsewhere, name="x")
    assert bearer(teammate.token).get("/api/v1/me/").status_code == 200

    assert path.remove(membership(teammate)) is None

    assert not Membership.objects.filter(user=teammate.user, tenant=owner.tenant).exists()
    token = ApiToken.objects.get(user=teammate.user, tenant=owner.tenant)
    assert token.revoked_at is not None
    revoked_at = token.revoked_at

    assert path.add(user=teammate.user, tenant=owner.tenant, role=Role.MEMBER) is None

    assert membership(teammate).role == Role.MEMBER
    token.refresh_from_db()
    assert token.revoked_at == revoked_at
    assert bearer(teammate.token).get("/api/v1/me/").status_code == 401
    # Its token in another tenant is none of this tenant's business.
    assert bearer(other_secret).get("/api/v1/me/").status_code == 200


def test_the_last_admin_cannot_be_removed(path, owner, teammate):
    assert path.remove(membership(owner)) == NEEDS_AN_ADMIN

    assert membership(owner).role == Role.ADMIN
    assert ApiToken.objects.get(user=owner.user).revoked_at is None


def test_the_last_admin_cannot_be_demoted(path, owner, teammate):
    assert path.set_role(membership(owner), Role.MEMBER) == NEEDS_AN_ADMIN

    assert membership(owner).role == Role.ADMIN


def test_with_a_second_admin_the_first_may_step_down(path, owner, teammate):
    assert path.set_role(membership(teammate), Role.ADMIN) is None

    assert path.set_role(membership(owner), Role.VIEWER) is None

    assert membership(owner).role == Role.VIEWER


def test_with_a_second_admin_the_first_may_leave(path, owner, teammate):
    assert path.set_role(membership(teammate), Role.ADMIN) is None

    assert path.remove(membership(owner)) is None

    assert list(Membership.objects.values_list("user__username", "role")) == [("bob", Role.ADMIN)]
    assert ApiToken.objects.get(user=owner.user).revoked_at is not None


# --- The admin's other ways to write a membership ----------------------------------------------


@pytest.fixture
def operator(db, client):
    return AdminPath(client)


def test_the_bulk_delete_action_removes_through_the_service(operator, owner, teammate):
    viewer = MembershipFactory(tenant=owner.tenant, role=Role.VIEWER)
    selected = {"action": "delete_selected", "post": "yes"}
    url = admin_url(Membership, "changelist")

    response = operator.client.post(
        url, {**selected, "_selected_action": [membership(teammate).pk, viewer.pk]}
    )

    assert refusal(response) is None
    assert list(Membership.objects.values_list("user__username", flat=True)) == ["alice"]
    assert ApiToken.objects.get(user=teammate.user).revoked_at is not None


def test_the_bulk_delete_action_keeps_the_last_admin_and_changes_nothing(operator, owner, teammate):
    url = admin_url(Membership, "changelist")
    chosen = [membership(teammate).pk, membership(owner).pk]

    response = operator.client.post(
        url, {"action": "delete_selected", "post": "yes", "_selected_action": chosen}
    )

    assert refusal(response) == NEEDS_AN_ADMIN
    assert Membership.objects.count() == 2
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()


def tenant_page(tenant: Tenant, rows: list[dict]) -> dict:
    """The tenant's change form with its member rows as given (and no quota rows)."""
    form = {"name": tenant.name, "is_active": "on", "memberships-TOTAL_FORMS": len(rows),
            "memberships-INITIAL_FORMS": sum("id" in r for r in rows),
            "quotas-TOTAL_FORMS": 0, "quotas-INITIAL_FORMS": 0}  # fmt: skip
    for i, row in enumerate(rows):
        form.update({f"memberships-{i}-{key}": value for key, value in row.items()})
        form[f"memberships-{i}-tenant"] = tenant.pk
    return form


def row(m: Membership, **change) -> dict:
    return {"id": m.pk, "user": m.user_id, "role": m.role, **change}


def test_the_tenant_page_s_member_rows_remove_and_add_through_the_service(
    operator, owner, teammate, outsider
):
    rows = [row(membership(owner)), row(membership(teammate), DELETE="on"),
            {"user": outsider.user.pk, "role": Role.VIEWER}]  # fmt: skip

    response = operator.client.post(admin_url(Tenant, "change", owner.tenant.pk),
                                    tenant_page(owner.tenant, rows))  # fmt: skip

    assert refusal(response) is None
    members = Membership.objects.filter(tenant=owner.tenant)
    assert sorted(members.values_list("user__username", "role")) == [
        ("alice", Role.ADMIN),
        ("charlie", Role.VIEWER),
    ]
    assert ApiToken.objects.get(user=teammate.user).revoked_at is not None


def test_the_tenant_page_keeps_the_last_admin_and_changes_nothing(operator, owner, teammate):
    rows = [row(membership(owner), role=Role.MEMBER), row(membership(teammate), DELETE="on")]
    form = {**tenant_page(owner.tenant, rows), "display_name": "Renamed"}

    response = operator.client.post(admin_url(Tenant, "change", owner.tenant.pk), form)

    assert refusal(response) == NEEDS_AN_ADMIN
    assert sorted(Membership.objects.values_list("user__username", "role")) == [
        ("alice", Role.ADMIN),
        ("bob", Role.MEMBER),
    ]
    owner.tenant.refresh_from_db()
    assert owner.tenant.display_name == ""
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()


def test_the_tenant_page_promotes_before_it_removes(operator, owner, teammate):
    rows = [row(membership(owner), DELETE="on"), row(membership(teammate), role=Role.ADMIN)]

    response = operator.client.post(admin_url(Tenant, "change", owner.tenant.pk),
                                    tenant_page(owner.tenant, rows))  # fmt: skip

    assert refusal(response) is None
    assert list(Membership.objects.values_list("user__username", "role")) == [("bob", Role.ADMIN)]


def test_a_membership_s_change_page_cannot_move_it_to_another_user_or_tenant(
    operator, owner, teammate, outsider
):
    bob = membership(teammate)
    form = {"user": outsider.user.pk, "tenant": TenantFactory(name="speech-lab").pk,
            "role": Role.VIEWER}  # fmt: skip

    response = operator.client.post(admin_url(Membership, "change", bob.pk), form)

    assert refusal(response) is None
    bob.refresh_from_db()
    assert (bob.user, bob.tenant, bob.role) == (teammate.user, owner.tenant, Role.VIEWER)
    assert list(Membership.objects.filter(user=outsider.user)) == [membership(outsider)]


def test_an_operator_cannot_demote_the_last_admin_through_the_api_either(owner):
    olga = UserFactory(username="olga", is_staff=True)
    MembershipFactory(user=olga, tenant=TenantFactory(name="ops"), role=Role.ADMIN)
    _, secret = services.apitoken_create(user=olga, tenant=olga.memberships.get().tenant, name="t")
    url = "/api/v1/operator/tenants/vision-lab/members/"

    response = bearer(secret).post(url, {"username": "alice", "role": "member"}, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["errors"] == {"role": [NEEDS_AN_ADMIN]}
    assert membership(owner).role == Role.ADMIN
