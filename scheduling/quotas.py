"""Writes of tenants' quotas: the admin, the operators' API and the bootstrap command save and
delete them only here.

The rows live in ``tenants`` (the bottom layer, which imports nothing above it); what a quota
change sets off is the scheduler's business, so the services live here."""

from __future__ import annotations

from django.db import transaction

from scheduling import passes
from scheduling.models import Successor
from tenants.models import Quota


@transaction.atomic
def quota_set(*, quota: Quota) -> Quota:
    """Save a new or changed quota, as the caller filled it in. The model's rules are checked
    here whoever calls (``Quota.validate_constraints``: ValidationError naming the field);
    waiting tasks are reconsidered, since a raised limit may let them start.

    The tenant's listed successors go (waiting for a hand-off under way with one of them):
    they were counted against the quota as it was, and a swap, which keeps the tenant's use as
    it is, must not keep a use the new quota no longer allows."""
    quota.full_clean()
    quota.save()
    Successor.objects.filter(task__tenant_id=quota.tenant_id).delete()
    passes.request_pass()
    return quota


@transaction.atomic
def quota_delete(*, quota: Quota) -> None:
    """Remove a quota: its tenant's waiting tasks are reconsidered without it."""
    quota.delete()
    passes.request_pass()
