"""Bearer tokens: stored hashed, shown once, refused with 401 the moment they stop being valid."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services, tokens
from tenants.models import ApiToken, Membership
from tests.factories import TenantFactory, UserFactory

ME = "/api/v1/me/"


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_it_stores_only_a_hash_and_a_visible_prefix(owner):
    token = ApiToken.objects.get(user=owner.user)
    assert owner.token.startswith(token.prefix + "_")
    assert token.prefix.startswith("gpup_")
    assert owner.token not in (token.key_hash, token.prefix, token.name)
    assert token.key_hash == tokens.hash_token(owner.token)


def test_a_valid_token_authenticates_with_its_tenant(owner):
    response = bearer(owner.token).get(ME)
    assert response.status_code == 200
    assert response.json()["tenant"] == "vision-lab"
    assert response.json()["username"] == "alice"
    assert response.json()["memberships"] == [{"tenant": "vision-lab", "role": "admin"}]


def test_it_answers_401_with_a_bearer_challenge_without_credentials(db):
    response = APIClient().get(ME)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer a b", "Bearer gpup_x", "Bearer gpup_AAAAAAAA_" + "x" * 40, "Bearer \u00e9"],
)
def test_it_answers_401_to_malformed_or_unknown_tokens(owner, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get(ME).status_code == 401


def test_it_refuses_a_known_prefix_with_the_wrong_secret(owner):
    prefix = ApiToken.objects.get(user=owner.user).prefix
    forged = f"{prefix}_{'A' * 40}"
    assert bearer(forged).get(ME).status_code == 401


def test_a_revoked_token_is_refused_at_once(owner):
    client = bearer(owner.token)
    assert client.get(ME).status_code == 200
    revoked = services.apitokens_revoke(tokens=ApiToken.objects.filter(user=owner.user))
    assert revoked == 1
    response = client.get(ME)
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]


def test_revoking_twice_keeps_the_first_time(owner):
    qs = ApiToken.objects.filter(user=owner.user)
    services.apitokens_revoke(tokens=qs)
    first = qs.get().revoked_at
    assert services.apitokens_revoke(tokens=qs) == 0
    assert qs.get().revoked_at == first


def test_an_expired_token_is_refused(owner):
    ApiToken.objects.filter(user=owner.user).update(expires_at=timezone.now() - timedelta(1))
    response = bearer(owner.token).get(ME)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_a_token_of_a_removed_member_or_inactive_tenant_is_refused(owner, teammate):
    Membership.objects.filter(user=owner.user).delete()
    assert bearer(owner.token).get(ME).status_code == 401
    teammate.tenant.is_active = False
    teammate.tenant.save()
    assert bearer(teammate.token).get(ME).status_code == 401


def test_it_records_when_a_token_was_last_used(owner):
    assert ApiToken.objects.get(user=owner.user).last_used_at is None
    bearer(owner.token).get(ME)
    assert ApiToken.objects.get(user=owner.user).last_used_at is not None


def test_only_members_get_tokens_and_expiry_must_be_in_the_future(db):
    user, tenant = UserFactory(), TenantFactory()
    with pytest.raises(ValueError, match="not a member"):
        services.apitoken_create(user=user, tenant=tenant, name="x")
    services.membership_change(user=user, tenant=tenant, role="member")
    with pytest.raises(ValueError, match="expires_at"):
        services.apitoken_create(
            user=user, tenant=tenant, name="x", expires_at=timezone.now() - timedelta(1)
        )


def test_the_session_of_a_logged_in_user_also_works(owner):
    client = APIClient()
    client.force_login(owner.user)
    response = client.get(ME)
    assert response.status_code == 200
    assert response.json()["tenant"] is None


def test_inventory_endpoints_need_authentication(owner, workstation):
    assert APIClient().get("/api/v1/gpus/").status_code == 401
    response = bearer(owner.token).get("/api/v1/gpus/")
    assert response.status_code == 200
    assert response.json()["count"] == 4
    nodes = bearer(owner.token).get("/api/v1/nodes/").json()["results"]
    assert [(n["name"], n["gpu_count"]) for n in nodes] == [("workstation-1", 4)]


def test_gpu_list_queries_do_not_grow_with_the_page(owner, workstation):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = bearer(owner.token)
    client.get("/api/v1/gpus/")  # warm: last_used_at write

    def count(limit: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"/api/v1/gpus/?limit={limit}").status_code == 200
        return len(queries)

    assert count(1) == count(4)


def test_prefix_of_rejects_anything_but_the_token_shape():
    token, prefix = tokens.generate()
    assert tokens.prefix_of(token) == prefix
    for bad in ["", "gpup", "gpup__", "ghp_abc", token + "x", token.replace("gpup", "gpuq")]:
        assert tokens.prefix_of(bad) is None


# --- Tokens made by tokens: they cannot outlive or outrank their parent ---------------------

TOKENS = "/api/v1/tokens/"


def make_child(secret: str, **body) -> dict:
    response = bearer(secret).post(TOKENS, {"name": "child", **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_token_made_by_a_token_records_it_and_inherits_its_expiry(owner):
    parent = ApiToken.objects.get(user=owner.user)
    parent.expires_at = timezone.now() + timedelta(days=3)
    parent.save()
    child = make_child(owner.token)
    assert child["parent"] == parent.pk
    assert ApiToken.objects.get(pk=child["id"]).expires_at == parent.expires_at
    shorter = make_child(owner.token, expires_in_days=1)
    assert ApiToken.objects.get(pk=shorter["id"]).expires_at < parent.expires_at


def test_a_token_cannot_make_one_that_outlives_it(owner):
    ApiToken.objects.filter(user=owner.user).update(expires_at=timezone.now() + timedelta(days=3))
    response = bearer(owner.token).post(
        TOKENS, {"name": "longer", "expires_in_days": 30}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["expires_in_days"]
    assert "must not outlive" in response.json()["detail"]
    assert ApiToken.objects.filter(name="longer").count() == 0


def test_a_token_made_in_a_browser_session_has_no_parent(owner):
    client = APIClient()
    client.force_login(owner.user)
    response = client.post(TOKENS, {"name": "from-session"}, format="json")
    assert response.status_code == 201
    assert response.json()["parent"] is None
    assert response.json()["expires_at"] is None


@pytest.mark.parametrize("how", ["revoked", "expired"])
def test_children_and_grandchildren_die_with_their_ancestor(owner, how):
    child = make_child(owner.token)
    grandchild = make_child(child["token"])
    assert ApiToken.objects.get(pk=grandchild["id"]).parent_id == child["id"]
    assert bearer(grandchild["token"]).get(ME).status_code == 200
    root = ApiToken.objects.filter(user=owner.user, parent=None)
    if how == "revoked":
        services.apitokens_revoke(tokens=root)
    else:
        root.update(expires_at=timezone.now() - timedelta(seconds=1))
    for secret in (child["token"], grandchild["token"]):
        response = bearer(secret).get(ME)
        assert response.status_code == 401
        assert "the token that created it was revoked or expired" in response.json()["detail"]


def test_the_parent_check_is_part_of_the_one_authentication_query(owner):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    child = make_child(owner.token)
    client = bearer(child["token"])
    client.get(ME)  # warm: last_used_at write
    with CaptureQueriesContext(connection) as queries:
        assert client.get(ME).status_code == 200
    token_queries = [q for q in queries if "tenants_apitoken" in q["sql"]]
    assert len(token_queries) == 1
    assert "WITH RECURSIVE" in token_queries[0]["sql"]


def test_the_service_refuses_a_parent_of_another_user_or_a_longer_life(owner, teammate):
    parent = ApiToken.objects.get(user=owner.user)
    with pytest.raises(ValueError, match="parent"):
        services.apitoken_create(
            user=teammate.user, tenant=teammate.tenant, name="x", parent=parent
        )
    parent.expires_at = timezone.now() + timedelta(days=1)
    with pytest.raises(ValueError, match="expires_at"):
        services.apitoken_create(
            user=owner.user,
            tenant=owner.tenant,
            name="x",
            parent=parent,
            expires_at=timezone.now() + timedelta(days=2),
        )
