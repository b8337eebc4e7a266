"""Reading alerts. Tenants see the alerts about their own tasks (an idle GPU they hold, an
XID that ended their task), never another tenant's or the estate's."""

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
