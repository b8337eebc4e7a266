"""What each role may do in its tenant: the one place that answers "may this caller do X (to
this object)". Every API view asks here (through ``gpuplatform.api``); so should the portal.

=========================================  ======  ======  =====
action                                     viewer  member  admin
=========================================  ======  ======  =====
read tasks, logs, events, nodes, GPUs,       yes     yes    yes
pools, usage; own API tokens
submit tasks                                  -      yes    yes
cancel, pause, resume, retry a task           -      own    any
see the tenant's quota and fair share         -       -     yes
manage members (add, change role, remove)     -       -     yes
list and revoke every token of the tenant     -       -     yes
=========================================  ======  ======  =====

Operators (staff) are not a tenant role: their endpoints live under ``/operator/``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from tenants.models import Role

# Reasons are translated to the request's language (Accept-Language), API and portal alike.
READ_ONLY = gettext_lazy("your role in this tenant may only read")


class Action(StrEnum):
    READ = "read"
    OWN_TOKENS = "own_tokens"  # create and revoke the caller's own tokens
    SUBMIT = "submit"
    CONTROL_TASK = "control_task"  # cancel, pause, resume, retry
    VIEW_QUOTA = "view_quota"
    MANAGE_MEMBERS = "manage_members"
    MANAGE_TOKENS = "manage_tokens"  # every token of the tenant


EVERYONE = frozenset(Role)
WRITERS = frozenset({Role.MEMBER, Role.ADMIN})
ADMINS = frozenset({Role.ADMIN})

GRANTS: dict[Action, frozenset[Role]] = {
    Action.READ: EVERYONE,
    # A token acts with its owner's role: a viewer needs one to read from scripts, and must be
    # able to revoke it when it leaks.
    Action.OWN_TOKENS: EVERYONE,
    Action.SUBMIT: WRITERS,
    Action.CONTROL_TASK: WRITERS,  # a member: only its own tasks (see ``denial``)
    Action.VIEW_QUOTA: ADMINS,
    Action.MANAGE_MEMBERS: ADMINS,
    Action.MANAGE_TOKENS: ADMINS,
}

ADMIN_ONLY = {
    Action.VIEW_QUOTA: gettext_lazy("only the tenant's admins may see the tenant's quota"),
    Action.MANAGE_MEMBERS: gettext_lazy("only the tenant's admins may manage the tenant's members"),
    Action.MANAGE_TOKENS: gettext_lazy("only the tenant's admins may manage the tenant's tokens"),
}


class Owned(Protocol):
    pk: int | None
    owner_id: int | None


def denial(
    *, role: str, action: Action, user_id: int | None = None, obj: Owned | None = None
) -> str | None:
    """Why ``role`` (held by the user ``user_id``) may not do ``action`` to ``obj``; None when it
    may. Without ``obj``: whether the role may do it to anything at all."""
    if role not in GRANTS[action]:
        if action in ADMIN_ONLY:
            return str(ADMIN_ONLY[action])
        return str(READ_ONLY)
    if action == Action.CONTROL_TASK and obj is not None and role != Role.ADMIN:
        if obj.owner_id is None or obj.owner_id != user_id:
            return _(
                "a member may control only its own tasks; task %(id)s is a teammate's "
                "(ask a tenant admin)"
            ) % {"id": obj.pk}
    return None


def may(*, role: str, action: Action, user_id: int | None = None, obj: Owned | None = None) -> bool:
    return denial(role=role, action=action, user_id=user_id, obj=obj) is None
