"""The invariants PostgreSQL itself holds for memberships, quotas and API tokens.

Writes skip model validation, so a refusal can only come from the database; each refusal is
paired with the nearest write that must still be accepted.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import IntegrityError, transaction

from tenants.models import Membership, Quota, Role
from tests.factories import (
    MembershipFactory,
    PoolFactory,
    QuotaFactory,
    TenantFactory,
    UserFactory,
    make_token,
)

pytestmark = pytest.mark.django_db


@contextmanager
def refused(match: str):
    """Expect PostgreSQL to refuse the write; the savepoint keeps the test transaction usable."""
    with pytest.raises(IntegrityError, match=match), transaction.atomic():
        yield


def test_it_refuses_a_second_membership_of_a_user_in_one_tenant(lab):
    alice = UserFactory(username="alice")
    MembershipFactory(user=alice, tenant=lab, role=Role.ADMIN)
    with refused("membership_unique_user"):
        MembershipFactory(user=alice, tenant=lab, role=Role.VIEWER)

    MembershipFactory(user=alice, tenant=TenantFactory(name="nlp-lab"))
    assert Membership.objects.filter(user=alice).count() == 2


def test_it_refuses_an_unknown_role(lab):
    with refused("membership_role_valid"):
        MembershipFactory(tenant=lab, role="owner")
    membership = MembershipFactory(tenant=lab, role=Role.VIEWER)
    with refused("membership_role_valid"):
        Membership.objects.filter(pk=membership.pk).update(role="root")


def test_it_refuses_two_cluster_wide_quotas_for_one_tenant(lab):
    QuotaFactory(tenant=lab)
    with refused("quota_one_cluster_wide"):
        QuotaFactory(tenant=lab, max_gpus=8)


def test_it_refuses_two_quotas_for_one_pool_of_a_tenant(lab):
    training = PoolFactory(name="training")
    QuotaFactory(tenant=lab, pool=training)
    with refused("quota_one_per_pool"):
        QuotaFactory(tenant=lab, pool=training, max_gpus=8)


def test_it_accepts_a_cluster_wide_quota_beside_one_per_pool(lab):
    QuotaFactory(tenant=lab)
    QuotaFactory(tenant=lab, pool=PoolFactory(name="training"))
    QuotaFactory(tenant=lab, pool=PoolFactory(name="inference"))
    QuotaFactory(tenant=TenantFactory(name="nlp-lab"))
    assert Quota.objects.filter(tenant=lab).count() == 3


def test_it_refuses_a_quota_priority_above_100(lab):
    quota = QuotaFactory(tenant=lab, max_priority=100)
    with refused("quota_priority_range"):
        Quota.objects.filter(pk=quota.pk).update(max_priority=101)


def test_it_refuses_a_fair_share_weight_of_zero(lab):
    with refused("quota_weight_positive"):
        QuotaFactory(tenant=lab, fair_share_weight=0)
    QuotaFactory(tenant=lab, fair_share_weight=0.01)


def test_it_refuses_two_tokens_with_one_prefix(owner):
    token = make_token(user=owner.user, tenant=owner.tenant, name="laptop")
    with refused("prefix"):
        make_token(user=owner.user, tenant=owner.tenant, name="ci", prefix=token.prefix)
