"""Portal test helpers: browsers signed in as the three actors, a viewer, and a task of each."""

from __future__ import annotations

import pytest
from django.test import Client

from tenants.models import Role
from tests.api.conftest import make_actor
from tests.factories import TaskFactory


def browser(actor=None, language: str = "en") -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    if actor is not None:
        client.force_login(actor.user)
    return client


@pytest.fixture
def viewer(lab):
    """Dave: may read the vision lab, not write to it."""
    return make_actor(lab, Role.VIEWER, "dave")


@pytest.fixture
def bobs_task(teammate):
    return TaskFactory(tenant=teammate.tenant, owner=teammate.user, name="bob-train")


@pytest.fixture
def foreign_task(outsider):
    return TaskFactory(tenant=outsider.tenant, owner=outsider.user, name="nlp-secret")
