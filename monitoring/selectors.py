"""Reads of alerts, scoped like every tenant-facing read: the tenant is a required argument."""

from __future__ import annotations

from monitoring.models import Alert
from tenants.models import Tenant


def alerts_open_for_tasks(*, tenant: Tenant, owner_id: int | None = None, limit: int = 20):
    """Unresolved alerts about the tenant's tasks (one owner's, when given), newest first."""
    alerts = Alert.objects.filter(resolved_at__isnull=True, task__tenant=tenant)
    if owner_id is not None:
        alerts = alerts.filter(task__owner_id=owner_id)
    return list(alerts.select_related("task").order_by("-opened_at", "-id")[:limit])
