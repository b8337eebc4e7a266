from django.contrib import admin, messages
from django.db.models import QuerySet
from django.utils.html import format_html

from gpuplatform.admin import ReadOnlyAdmin
from monitoring import services
from monitoring.models import Alert, Severity

_SEVERITY_COLOURS = {
    Severity.INFO: "#417690",
    Severity.WARNING: "#c87f0a",
    Severity.CRITICAL: "#ba2121",
}


class OpenFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("open", "open"), ("resolved", "resolved")]

    def queryset(self, request, queryset):
        if self.value() == "open":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = [
        "opened_at",
        "kind",
        "severity_badge",
        "gpu",
        "task",
        "node",
        "message",
        "last_seen_at",
        "resolved_at",
    ]
    list_filter = [OpenFilter, "kind", "severity", "node"]
    search_fields = ["message", "gpu__uuid", "node__name", "task__name", "=task__id"]
    list_select_related = ["gpu__node", "task", "node"]
    date_hierarchy = "opened_at"
    fields = [
        "kind",
        "severity",
        "message",
        "gpu",
        "task",
        "node",
        "opened_at",
        "last_seen_at",
        "resolved_at",
    ]
    readonly_fields = fields
    actions = ["resolve"]

    # Alerts are opened and closed by what the platform observes; operators only resolve them.

    def has_resolve_permission(self, request) -> bool:
        return request.user.has_perm("monitoring.change_alert")

    @admin.display(ordering="severity", description="severity")
    def severity_badge(self, obj: Alert) -> str:
        return format_html(
            '<span style="color:#fff;background:{};padding:1px 6px;border-radius:3px">{}</span>',
            _SEVERITY_COLOURS.get(obj.severity, "#555"),
            obj.severity,
        )

    @admin.action(description="Resolve the selected alerts", permissions=["resolve"])
    def resolve(self, request, queryset: QuerySet[Alert]):
        count = services.alerts_resolve(alerts=queryset)
        self.message_user(request, f"Resolved {count} alert(s).", messages.SUCCESS)
