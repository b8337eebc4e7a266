"""Shared fixtures: factories and the three actors (owner, teammate, outsider)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User

from tenants import services as tenant_services
from tenants.models import Role, Tenant
from tests.factories import (
    MembershipFactory,
    NodeFactory,
    TenantFactory,
    UserFactory,
    make_gpus,
)

# Browser fixtures (headless Chromium against daphne), for any test module: see tests/browser.py.
pytest_plugins = ["tests.browser"]


@dataclass
class Actor:
    user: User
    tenant: Tenant
    token: str


def _actor(tenant: Tenant, role: str, username: str) -> Actor:
    user = UserFactory(username=username)
    MembershipFactory(user=user, tenant=tenant, role=role)
    _, secret = tenant_services.apitoken_create(user=user, tenant=tenant, name="test")
    return Actor(user=user, tenant=tenant, token=secret)


@pytest.fixture(autouse=True)
def _forget_throttled_clients():
    """Each process remembers clients over their rate (gpuplatform.throttle.PACER); tests
    start with none, whatever the test before did."""
    from gpuplatform.throttle import PACER

    PACER.clear()
    yield
    PACER.clear()


@pytest.fixture
def lab(db) -> Tenant:
    return TenantFactory(name="vision-lab")


@pytest.fixture
def owner(lab) -> Actor:
    """Alice: admin of the vision lab."""
    return _actor(lab, Role.ADMIN, "alice")


@pytest.fixture
def teammate(lab) -> Actor:
    """Bob: a member of the same lab."""
    return _actor(lab, Role.MEMBER, "bob")


@pytest.fixture
def outsider(db) -> Actor:
    """Charlie: member of another tenant; must never see the lab's objects."""
    return _actor(TenantFactory(name="nlp-lab"), Role.MEMBER, "charlie")


@pytest.fixture
def workstation(db):
    """One node with 4 x RTX 4090 24 GB, as the default configuration simulates."""
    node = NodeFactory(name="workstation-1")
    make_gpus(node, count=4)
    return node
