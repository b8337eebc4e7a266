"""Writes of tenants' quotas: the admin, the operators' API and the bootstrap command save and
delete them only here.

The rows live in ``tenants`` (the bottom layer, which imports nothing above it); what a quota
change sets off is the scheduler's business, so the services live here."""

from __future__ import annotations

from django.db import transaction

from scheduling import passes
from tenants.models import Quota


@transaction.atomic
def quota_set(*, quota: Quota) -> Quota:
    """Save a new or changed quota, as the caller filled it in. The model's rules are checked
    here whoever calls (``Quota.validate_constraints``: ValidationError naming the field);
    waiting tasks are reconsidered, since a raised limit may let them start."""
    quota.full_clean()
    quota.save()
    passes.request_pass()
    return quota


@transaction.atomic
def quota_delete(*, quota: Quota) -> None:
    """Remove a quota: its tenant's waiting tasks are reconsidered without it."""
    quota.delete()
    passes.request_pass()
