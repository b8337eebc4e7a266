"""The tenant API: who am I, my tokens, my tenant's quota and usage; operators' tenants,
members and quotas."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest
from django.utils import timezone

from scheduling import scheduler
from scheduling.models import GPU
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tenants import services as tenant_services
from tenants.models import ApiToken, Membership, Quota, Role
from tests.api.conftest import (
    api_client,
    assert_constant_queries,
    assert_error_shape,
    bearer,
    make_actor,
)
from tests.factories import (
    AllocationFactory,
    MembershipFactory,
    PoolFactory,
    QuotaFactory,
    TaskFactory,
    TenantFactory,
)

pytestmark = pytest.mark.usefixtures("fresh_cache")

API = "/api/v1/"
TOKENS = f"{API}tokens/"


@pytest.fixture
def alice(owner):
    return bearer(owner.token)


@pytest.fixture
def olga(operator):
    return bearer(operator.token)


def prefix_of(actor) -> str:
    return ApiToken.objects.get(user=actor.user, tenant=actor.tenant, name="test").prefix


# --- Me -------------------------------------------------------------------------------------------


def test_me_names_the_user_the_tokens_tenant_and_every_membership(alice, owner, outsider):
    MembershipFactory(user=owner.user, tenant=outsider.tenant, role=Role.VIEWER)
    body = alice.get(f"{API}me/").json()
    assert body == {
        "username": "alice",
        "is_operator": False,
        "tenant": "vision-lab",
        "token": prefix_of(owner),
        "memberships": [
            {"tenant": "nlp-lab", "role": "viewer"},
            {"tenant": "vision-lab", "role": "admin"},
        ],
    }


def test_me_tells_an_operator_and_a_browser_session_apart(olga, owner):
    assert olga.get(f"{API}me/").json()["is_operator"] is True
    client = api_client()
    client.force_login(owner.user)
    body = client.get(f"{API}me/").json()
    assert (body["tenant"], body["token"]) == (None, None)


# --- Tokens ---------------------------------------------------------------------------------------


def test_a_new_token_shows_its_secret_once_and_works(alice, owner):
    response = alice.post(TOKENS, {"name": "ci", "expires_in_days": 30}, format="json")
    assert response.status_code == 201
    created = response.json()
    secret = created["token"]
    assert secret.startswith(created["prefix"] + "_")
    assert created["tenant"] == "vision-lab"
    expires = datetime.fromisoformat(created["expires_at"])
    assert timedelta(days=29) < expires - timezone.now() <= timedelta(days=30)
    assert bearer(secret).get(f"{API}me/").json()["token"] == created["prefix"]

    listed = alice.get(TOKENS)
    assert secret not in listed.content.decode()
    rows = listed.json()["results"]
    assert all("token" not in row and "key_hash" not in row for row in rows)
    assert {row["name"] for row in rows} == {"test", "ci"}
    assert ApiToken.objects.get(pk=created["id"]).key_hash not in listed.content.decode()


def test_the_token_list_holds_only_the_callers_tokens_in_this_tenant(
    alice, owner, teammate, outsider
):
    MembershipFactory(user=owner.user, tenant=outsider.tenant)
    tenant_services.apitoken_create(user=owner.user, tenant=outsider.tenant, name="elsewhere")
    rows = alice.get(TOKENS).json()["results"]
    assert [(row["name"], row["tenant"]) for row in rows] == [("test", "vision-lab")]
    assert prefix_of(teammate) not in alice.get(TOKENS).content.decode()


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "ci", "expires_in_days": 0}, "expires_in_days"),
        ({"name": "ci", "expires_in_days": 3651}, "expires_in_days"),
        ({"name": "ci", "expires_in_days": "soon"}, "expires_in_days"),
    ],
)
def test_bad_token_requests_answer_400_naming_the_field(alice, body, field):
    assert_error_shape(alice.post(TOKENS, body, format="json"), 400, field)
    assert ApiToken.objects.count() == 1


def test_a_revoked_token_is_refused_from_the_next_request(alice, owner):
    _, secret = tenant_services.apitoken_create(user=owner.user, tenant=owner.tenant, name="ci")
    token = ApiToken.objects.get(name="ci")
    assert bearer(secret).get(f"{API}me/").status_code == 200
    response = alice.delete(f"{TOKENS}{token.pk}/")
    assert response.status_code == 204
    assert response.content == b""
    refused = bearer(secret).get(f"{API}me/")
    assert_error_shape(refused, 401)
    assert "revoked" in refused.json()["detail"]
    listed = {row["name"]: row for row in alice.get(TOKENS).json()["results"]}
    assert listed["ci"]["revoked_at"] is not None


def test_revoking_the_token_in_use_locks_it_out(alice, owner):
    own = ApiToken.objects.get(user=owner.user)
    assert alice.delete(f"{TOKENS}{own.pk}/").status_code == 204
    assert alice.get(f"{API}me/").status_code == 401


def test_another_users_token_is_404_and_stays_valid(alice, owner, teammate, outsider):
    MembershipFactory(user=owner.user, tenant=outsider.tenant)
    mine_elsewhere, _ = tenant_services.apitoken_create(
        user=owner.user, tenant=outsider.tenant, name="elsewhere"
    )
    for token in (
        ApiToken.objects.get(user=teammate.user),  # a teammate's
        ApiToken.objects.get(user=outsider.user),  # another tenant's
        mine_elsewhere,  # alice's own, but for another tenant than this token's
    ):
        response = alice.delete(f"{TOKENS}{token.pk}/")
        assert_error_shape(response, 404)
        assert token.prefix not in response.content.decode()
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    assert bearer(teammate.token).get(f"{API}me/").status_code == 200


# --- Quota --------------------------------------------------------------------------------------


def test_quota_shows_limits_use_and_fair_share(alice, owner, workstation):
    training = PoolFactory(name="training")
    QuotaFactory(tenant=owner.tenant, max_gpus=3, max_queued_tasks=10, fair_share_weight=2.0)
    QuotaFactory(tenant=owner.tenant, pool=training, max_gpus=1, max_priority=50)
    body = alice.get(f"{API}quota/").json()
    assert body["tenant"] == "vision-lab"
    assert sorted(body["limits"], key=lambda q: q["pool"] or "") == [
        {"pool": None, "max_gpus": 3, "max_gpu_memory_mb": None, "max_running_tasks": None,
         "max_queued_tasks": 10, "max_priority": 100, "fair_share_weight": 2.0},
        {"pool": "training", "max_gpus": 1, "max_gpu_memory_mb": None, "max_running_tasks": None,
         "max_queued_tasks": None, "max_priority": 50, "fair_share_weight": 1.0},
    ]  # fmt: skip
    assert body["in_use"] == {
        "gpus": 0.0,
        "gpu_memory_mb": 0,
        "running_tasks": 0,
        "queued_tasks": 0,
    }
    assert body["fair_share"] == {"recent_gpus": 0.0, "weight": 2.0, "half_life_s": 86400}


def test_quota_in_use_reflects_a_scheduled_task(alice, owner, outsider, workstation):
    def submit(actor, name, **fields):
        spec = TaskSpec(name=name, command="true", **fields)
        return task_submit(tenant=actor.tenant, spec=spec, owner=actor.user)

    submit(owner, "whole", gpus_min=2, gpus_max=2)
    submit(owner, "half", gpu_memory_mb=12288)
    submit(outsider, "theirs", gpus_min=1, gpus_max=1)
    scheduler.schedule_pass()
    submit(owner, "waits", gpus_min=4, gpus_max=4)
    body = alice.get(f"{API}quota/").json()
    assert body["in_use"] == {
        "gpus": 2.5,
        "gpu_memory_mb": 2 * 24576 + 12288,
        "running_tasks": 2,
        "queued_tasks": 1,
    }
    assert body["fair_share"]["weight"] == 1.0  # no quota: the default weight


def test_fair_share_counts_recent_use(alice, owner, workstation):
    gpu = GPU.objects.filter(node=workstation).first()
    AllocationFactory(
        task=TaskFactory(tenant=owner.tenant),
        gpu=gpu,
        memory_mb=gpu.memory_mb,
        exclusive=True,
        started_at=timezone.now() - timedelta(hours=6),
    )
    assert alice.get(f"{API}quota/").json()["fair_share"]["recent_gpus"] > 0


# --- Usage --------------------------------------------------------------------------------------


@pytest.mark.parametrize("days", ["0", "367", "-1", "1.5", "abc", "²", ""])
def test_usage_days_must_be_1_to_366(alice, days):
    body = assert_error_shape(alice.get(f"{API}usage/", {"days": days}), 400, "days")
    assert "1 to 366" in body["errors"]["days"][0]


def test_usage_counts_gpu_hours_on_the_day_they_were_used(alice, owner, outsider, workstation):
    gpu = GPU.objects.filter(node=workstation).first()
    day = (timezone.now().astimezone(UTC) - timedelta(days=3)).date()

    def at(hour: int, on=day):
        return datetime.combine(on, time(hour), tzinfo=UTC)

    def used(tenant, start, end, memory_mb, exclusive):
        AllocationFactory(task=TaskFactory(tenant=tenant), gpu=gpu, memory_mb=memory_mb,
                          exclusive=exclusive, started_at=start, released_at=end)  # fmt: skip

    used(owner.tenant, at(10), at(12), 24576, True)  # 2 GPU-hours
    used(owner.tenant, at(11), at(13), 12288, False)  # half a GPU for 2 hours: 1
    used(owner.tenant, at(23), at(1, day + timedelta(days=1)), 24576, True)  # 1 each side
    used(outsider.tenant, at(10), at(20), 24576, True)  # not ours

    body = alice.get(f"{API}usage/", {"days": 7}).json()
    assert body["tenant"] == "vision-lab"
    per_day = {row["day"]: row["gpu_hours"] for row in body["days"]}
    assert len(per_day) == 7
    assert per_day[day.isoformat()] == pytest.approx(4.0)
    assert per_day[(day + timedelta(days=1)).isoformat()] == pytest.approx(1.0)
    assert body["total_gpu_hours"] == pytest.approx(5.0)
    assert len(alice.get(f"{API}usage/").json()["days"]) == 30


# --- Operators: tenants -----------------------------------------------------------------------


def test_operators_create_update_and_deactivate_tenants(olga, owner):
    response = olga.post(f"{API}operator/tenants/", {"name": "speech-lab"}, format="json")
    assert response.status_code == 201
    assert (response.json()["name"], response.json()["is_active"]) == ("speech-lab", True)
    url = f"{API}operator/tenants/vision-lab/"
    response = olga.patch(url, {"display_name": "Vision Lab"}, format="json")
    assert response.json()["display_name"] == "Vision Lab"
    assert bearer(owner.token).get(f"{API}me/").status_code == 200
    assert olga.patch(url, {"is_active": False}, format="json").status_code == 200
    assert_error_shape(bearer(owner.token).get(f"{API}me/"), 401)
    assert_error_shape(olga.get(f"{API}operator/tenants/no-such-lab/"), 404)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "Vision Lab"}, "name"),
        ({"name": "vision-lab"}, "name"),
        ({}, "name"),
        ({"name": "ok-lab", "is_active": "maybe"}, "is_active"),
        ({"name": "ok-lab", "id": 5, "created_at": "2020-01-01T00:00:00Z", "unix_user": "u" * 33},
         "unix_user"),
    ],
)  # fmt: skip
def test_bad_tenants_answer_400_naming_the_field(olga, owner, body, field):
    assert_error_shape(olga.post(f"{API}operator/tenants/", body, format="json"), 400, field)


# --- Operators: members -------------------------------------------------------------------------


def test_operators_add_members_and_change_their_role(olga, owner, outsider):
    url = f"{API}operator/tenants/vision-lab/members/"
    response = olga.post(url, {"username": "charlie", "role": "viewer"}, format="json")
    assert response.status_code == 201
    assert (response.json()["username"], response.json()["role"]) == ("charlie", "viewer")
    response = olga.post(url, {"username": "charlie", "role": "member"}, format="json")
    assert response.json()["role"] == "member"
    assert Membership.objects.get(user=outsider.user, tenant=owner.tenant).role == "member"
    rows = olga.get(url).json()["results"]
    assert [(r["username"], r["role"]) for r in rows] == [("alice", "admin"), ("charlie", "member")]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"username": "zed", "role": "member"}, "username"),
        ({"username": "charlie", "role": "owner"}, "role"),
        ({"role": "member"}, "username"),
    ],
)
def test_bad_members_answer_400_naming_the_field(olga, owner, outsider, body, field):
    url = f"{API}operator/tenants/vision-lab/members/"
    assert_error_shape(olga.post(url, body, format="json"), 400, field)
    assert not Membership.objects.filter(user=outsider.user, tenant=owner.tenant).exists()


def test_members_of_an_unknown_tenant_are_404(olga):
    url = f"{API}operator/tenants/no-such-lab/members/"
    assert_error_shape(olga.get(url), 404)
    assert_error_shape(olga.post(url, {"username": "olga", "role": "member"}, format="json"), 404)


# --- Operators: quotas --------------------------------------------------------------------------


def test_operators_create_change_and_remove_quotas(olga, owner):
    PoolFactory(name="training")
    url = f"{API}operator/quotas/"
    cluster = olga.post(url, {"tenant": "vision-lab", "max_gpus": 4}, format="json")
    assert cluster.status_code == 201, cluster.content
    assert cluster.json()["pool"] is None
    pooled = olga.post(
        url, {"tenant": "vision-lab", "pool": "training", "max_gpus": 2}, format="json"
    )
    assert pooled.status_code == 201
    detail = f"{url}{cluster.json()['id']}/"
    response = olga.put(detail, {"tenant": "vision-lab", "max_gpus": 6, "fair_share_weight": 1.5},
                        format="json")  # fmt: skip
    assert (response.json()["max_gpus"], response.json()["fair_share_weight"]) == (6, 1.5)
    assert olga.patch(detail, {"max_priority": 80}, format="json").json()["max_priority"] == 80
    assert olga.delete(detail).status_code == 204
    assert list(Quota.objects.values_list("pool__name", flat=True)) == ["training"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tenant": "vision-lab"}, "pool"),  # it already has a cluster-wide quota
        ({"tenant": "nlp-lab", "fair_share_weight": 0}, "fair_share_weight"),
        ({"tenant": "nlp-lab", "fair_share_weight": -1}, "fair_share_weight"),
        ({"tenant": "nlp-lab", "fair_share_weight": "NaN"}, "fair_share_weight"),
        ({"tenant": "nlp-lab", "max_priority": 101}, "max_priority"),
        ({"tenant": "nlp-lab", "max_gpus": -1}, "max_gpus"),
        ({"tenant": "no-such-lab"}, "tenant"),
        ({"tenant": "nlp-lab", "pool": "no-such-pool"}, "pool"),
        ({"max_gpus": 1}, "tenant"),
    ],
)
def test_bad_quotas_answer_400_naming_the_field(olga, owner, outsider, body, field):
    QuotaFactory(tenant=owner.tenant)
    assert_error_shape(olga.post(f"{API}operator/quotas/", body, format="json"), 400, field)
    assert Quota.objects.count() == 1


def test_moving_a_quota_onto_another_ones_place_is_refused(olga, owner):
    training = PoolFactory(name="training")
    QuotaFactory(tenant=owner.tenant)
    pooled = QuotaFactory(tenant=owner.tenant, pool=training)
    url = f"{API}operator/quotas/{pooled.pk}/"
    assert_error_shape(olga.patch(url, {"pool": None}, format="json"), 400, "pool")
    assert_error_shape(olga.patch(url, {"max_priority": 101}, format="json"), 400, "max_priority")
    pooled.refresh_from_db()
    assert (pooled.pool, pooled.max_priority) == (training, 100)


# --- Query counts ---------------------------------------------------------------------------------


def test_the_token_list_costs_the_same_queries_for_1_or_20_tokens(alice, owner):
    def grow():
        for i in range(20):
            tenant_services.apitoken_create(user=owner.user, tenant=owner.tenant, name=f"t{i}")

    assert_constant_queries(alice, TOKENS, grow)


def test_the_operator_tenant_list_costs_the_same_queries_for_few_or_20_tenants(olga):
    def grow():
        for i in range(20):
            TenantFactory(name=f"team-{i}")

    assert_constant_queries(olga, f"{API}operator/tenants/", grow)


def test_the_operator_member_list_costs_the_same_queries_for_1_or_20_members(olga, owner):
    def grow():
        for i in range(20):
            make_actor(owner.tenant, Role.MEMBER, f"member-{i}")

    assert_constant_queries(olga, f"{API}operator/tenants/vision-lab/members/", grow)


def test_the_operator_quota_list_costs_the_same_queries_for_1_or_20_quotas(olga, owner):
    QuotaFactory(tenant=owner.tenant)

    def grow():
        for i in range(20):
            pool = PoolFactory(name=f"pool-{i % 5}")
            QuotaFactory(tenant=TenantFactory(name=f"team-{i}"), pool=pool if i % 2 else None)

    assert_constant_queries(olga, f"{API}operator/quotas/", grow)


# --- Tenant admins: members and the tenant's tokens -------------------------------------------

MEMBERS = f"{API}tenant/members/"


def test_a_tenant_admin_adds_a_member_changes_its_role_and_removes_it(alice, owner, outsider):
    response = alice.post(MEMBERS, {"username": "charlie", "role": "viewer"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["role"] == "viewer"
    assert Membership.objects.get(user=outsider.user, tenant=owner.tenant).role == Role.VIEWER
    response = alice.patch(f"{MEMBERS}charlie/", {"role": "member"}, format="json")
    assert response.json() == {**response.json(), "username": "charlie", "role": "member"}
    _, secret = tenant_services.apitoken_create(user=outsider.user, tenant=owner.tenant, name="x")
    assert bearer(secret).get(f"{API}tasks/").status_code == 200
    assert alice.delete(f"{MEMBERS}charlie/").status_code == 204
    assert not Membership.objects.filter(user=outsider.user, tenant=owner.tenant).exists()
    # Its tokens in the lab are revoked (a later re-add does not bring them back); its own
    # tenant's are untouched.
    assert_error_shape(bearer(secret).get(f"{API}tasks/"), 401)
    Membership.objects.create(user=outsider.user, tenant=owner.tenant, role=Role.MEMBER)
    assert_error_shape(bearer(secret).get(f"{API}tasks/"), 401)
    assert bearer(outsider.token).get(f"{API}tasks/").status_code == 200


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "username"),
        ({"username": "nobody"}, "username"),
        ({"username": "charlie", "role": "owner"}, "role"),
    ],
)
def test_bad_member_requests_answer_400_naming_the_field(alice, outsider, body, field):
    assert_error_shape(alice.post(MEMBERS, body, format="json"), 400, field)
    assert not Membership.objects.filter(user=outsider.user, tenant__name="vision-lab").exists()


def test_the_last_admin_can_be_neither_demoted_nor_removed(alice, owner, teammate):
    body = assert_error_shape(
        alice.patch(f"{MEMBERS}alice/", {"role": "member"}, format="json"), 409, "role"
    )
    assert "needs an admin" in body["detail"]
    assert_error_shape(alice.delete(f"{MEMBERS}alice/"), 409, "role")
    assert Membership.objects.get(user=owner.user).role == Role.ADMIN
    # With a second admin, the first may step down.
    alice.patch(f"{MEMBERS}bob/", {"role": "admin"}, format="json")
    assert alice.patch(f"{MEMBERS}alice/", {"role": "member"}, format="json").status_code == 200


def test_a_tenant_admin_lists_and_revokes_every_token_of_the_tenant(alice, teammate, outsider):
    rows = alice.get(f"{API}tenant/tokens/").json()["results"]
    assert sorted((r["username"], r["tenant"]) for r in rows) == [
        ("alice", "vision-lab"),
        ("bob", "vision-lab"),
    ]
    bobs = ApiToken.objects.get(user=teammate.user)
    assert alice.delete(f"{API}tenant/tokens/{bobs.pk}/").status_code == 204
    assert_error_shape(bearer(teammate.token).get(f"{API}me/"), 401)
    charlies = ApiToken.objects.get(user=outsider.user)
    assert_error_shape(alice.delete(f"{API}tenant/tokens/{charlies.pk}/"), 404)
    assert bearer(outsider.token).get(f"{API}me/").status_code == 200


def test_a_member_may_not_control_a_teammates_task_but_the_admin_may(alice, owner, teammate):
    mine = TaskFactory(tenant=owner.tenant, owner=owner.user, state="pending")
    bobs = TaskFactory(tenant=owner.tenant, owner=teammate.user, state="pending")
    bob = bearer(teammate.token)
    body = assert_error_shape(bob.post(f"{API}tasks/{mine.pk}/cancel/"), 403)
    assert body["detail"] == (
        f"a member may control only its own tasks; task {mine.pk} is a teammate's "
        "(ask a tenant admin)"
    )
    mine.refresh_from_db()
    assert mine.state == "pending"
    assert bob.post(f"{API}tasks/{bobs.pk}/cancel/").json()["state"] == "cancelled"
    assert alice.post(f"{API}tasks/{mine.pk}/cancel/").json()["state"] == "cancelled"
