from django.contrib import admin

from gpuplatform.admin import ReadOnlyAdmin
from telemetry.models import SimulatedFault, XidRecord


@admin.register(XidRecord)
class XidRecordAdmin(ReadOnlyAdmin):
    """Every XID the node agents heard and the policy applied (telemetry.xid in
    configs/scheduler.yaml); the alerts they raised are under Monitoring."""

    list_display = ["at", "xid", "gpu", "task", "action", "simulated"]
    list_filter = ["action", "xid", "simulated"]
    list_select_related = ["gpu__node", "task"]
    search_fields = ["gpu__uuid", "gpu__node__name", "=xid", "=task__id"]
    date_hierarchy = "at"


@admin.register(SimulatedFault)
class SimulatedFaultAdmin(ReadOnlyAdmin):
    """Faults injected into simulated GPUs (manage.py gpu_fault)."""

    list_display = ["created_at", "gpu", "kind", "value", "applied_at"]
    list_filter = ["kind"]
    list_select_related = ["gpu__node"]
