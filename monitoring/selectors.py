"""Reading alerts. Tenants see the alerts about their own tasks (an idle GPU they hold, an
XID that ended their task), never another tenant's or the estate's: the tenant is a required
argument."""

from __future__ import annotations

from django.db.models import QuerySet

from monitoring.models import Alert
from tenants.models import Tenant


def alert_list(*, tenant: Tenant, open_only: bool = False) -> QuerySet[Alert]:
    alerts = Alert.objects.filter(task__tenant=tenant).select_related("gpu__node", "task", "node")
    return alerts.filter(resolved_at__isnull=True) if open_only else alerts


def alert_list_all(*, open_only: bool = False) -> QuerySet[Alert]:
    alerts = Alert.objects.select_related("gpu__node", "task", "node")
    return alerts.filter(resolved_at__isnull=True) if open_only else alerts


def alerts_open_for_tasks(*, tenant: Tenant, owner_id: int | None = None, limit: int = 20):
    """Unresolved alerts about the tenant's tasks (one owner's, when given), newest first."""
    alerts = alert_list(tenant=tenant, open_only=True)
    if owner_id is not None:
        alerts = alerts.filter(task__owner_id=owner_id)
    return list(alerts.order_by("-opened_at", "-id")[:limit])
