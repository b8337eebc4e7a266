"""The role matrix, as ``tenants.roles`` answers it (the API's permission matrix checks every
endpoint against the same table, written out independently)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tenants.models import Role
from tenants.roles import Action, denial, may

ALLOWED = {
    Action.READ: {"viewer", "member", "admin"},
    Action.OWN_TOKENS: {"viewer", "member", "admin"},
    Action.SUBMIT: {"member", "admin"},
    Action.CONTROL_TASK: {"member", "admin"},
    Action.VIEW_QUOTA: {"admin"},
    Action.MANAGE_MEMBERS: {"admin"},
    Action.MANAGE_TOKENS: {"admin"},
}


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("role", list(Role))
def test_each_role_may_do_what_the_readme_matrix_says(role, action):
    assert may(role=role, action=action, user_id=1) == (role in ALLOWED[action])


def test_a_member_controls_only_its_own_tasks_and_an_admin_every_one():
    own = SimpleNamespace(pk=7, owner_id=1)
    teammates = SimpleNamespace(pk=8, owner_id=2)
    unowned = SimpleNamespace(pk=9, owner_id=None)  # submitted by a script of a deleted user
    control = Action.CONTROL_TASK
    assert may(role=Role.MEMBER, action=control, user_id=1, obj=own)
    assert not may(role=Role.MEMBER, action=control, user_id=1, obj=teammates)
    assert not may(role=Role.MEMBER, action=control, user_id=1, obj=unowned)
    assert all(
        may(role=Role.ADMIN, action=control, user_id=1, obj=t) for t in (own, teammates, unowned)
    )
    assert not may(role=Role.VIEWER, action=control, user_id=1, obj=own)


def test_a_refusal_says_why():
    assert (
        denial(role=Role.VIEWER, action=Action.SUBMIT) == "your role in this tenant may only read"
    )
    assert denial(role=Role.MEMBER, action=Action.MANAGE_MEMBERS) == (
        "only the tenant's admins may manage the tenant's members"
    )
    assert denial(role=Role.VIEWER, action=Action.VIEW_QUOTA) == (
        "only the tenant's admins may see the tenant's quota"
    )
