from django.contrib import admin, messages
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.html import format_html

from gpuplatform.admin import ReadOnlyAdmin
from gpuplatform.units import format_memory_mb
from scheduling import scheduler, services
from scheduling.launcher.identity import SINGLE_USER_NOTE
from scheduling.models import GPU, Allocation, Node, Pool, SchedulerState, Task, TaskEvent


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "node_count"]
    search_fields = ["name", "description"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(node_count=Count("nodes"))

    @admin.display(ordering="node_count", description="nodes")
    def node_count(self, obj: Pool) -> int:
        return obj.node_count


class GpuInline(admin.TabularInline):
    model = GPU
    extra = 0
    can_delete = False
    fields = ["index", "uuid", "model", "gpu_type", "memory_mb", "state", "state_reason"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # GPUs are discovered by the node agent, never typed in


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "pool",
        "state_badge",
        "gpu_count",
        "backend",
        "hostname",
        "heartbeat_age",
        "isolation",
        "state_reason",
    ]
    list_filter = ["state", "pool", "backend"]
    search_fields = ["name", "hostname"]
    list_select_related = ["pool"]
    readonly_fields = [
        "registered_at",
        "last_heartbeat",
        "backend",
        "hostname",
        "isolation",
        "process_tracking",
    ]
    inlines = [GpuInline]
    actions = ["drain", "undrain"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(gpu_count=Count("gpus"))

    def changelist_view(self, request, extra_context=None):
        shared = Node.objects.filter(isolation=SINGLE_USER_NOTE).values_list("name", flat=True)
        if shared:
            self.message_user(
                request,
                f"{', '.join(shared)}: {SINGLE_USER_NOTE} (its node agent does not run as "
                "root, so every task runs as the platform's own user).",
                messages.WARNING,
            )
        return super().changelist_view(request, extra_context)

    @admin.display(ordering="gpu_count", description="GPUs")
    def gpu_count(self, obj: Node) -> int:
        return obj.gpu_count

    @admin.display(ordering="state", description="state")
    def state_badge(self, obj: Node) -> str:
        return _badge(obj.state)

    @admin.display(ordering="last_heartbeat", description="last heartbeat")
    def heartbeat_age(self, obj: Node) -> str:
        if obj.last_heartbeat is None:
            return "never"
        return f"{int((timezone.now() - obj.last_heartbeat).total_seconds())} s ago"

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        count = services.nodes_drain(nodes=queryset, actor=request.user)
        self.message_user(request, f"Draining {count} node(s).", messages.SUCCESS)

    @admin.action(description="Undrain: return drained nodes to service")
    def undrain(self, request, queryset):
        count = services.nodes_undrain(nodes=queryset, actor=request.user)
        self.message_user(request, f"Returned {count} node(s) to service.", messages.SUCCESS)


@admin.register(GPU)
class GpuAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "model",
        "gpu_type",
        "memory",
        "state_badge",
        "active_allocations",
        "foreign_memory_mb",
        "uuid",
        "last_seen_at",
    ]
    list_filter = ["state", "gpu_type", "node__pool", "node"]
    search_fields = ["uuid", "model", "gpu_type", "node__name", "pci_bus_id"]
    list_select_related = ["node"]
    readonly_fields = [
        "node",
        "index",
        "uuid",
        "model",
        "memory_mb",
        "pci_bus_id",
        "foreign_memory_mb",
        "first_seen_at",
        "last_seen_at",
    ]
    actions = ["drain", "undrain"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(active=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
        )

    def has_add_permission(self, request) -> bool:
        return False  # discovered by the node agent

    @admin.display(ordering="memory_mb")
    def memory(self, obj: GPU) -> str:
        return format_memory_mb(obj.memory_mb)

    @admin.display(ordering="active", description="allocations")
    def active_allocations(self, obj: GPU) -> int:
        return obj.active

    @admin.display(ordering="state", description="state")
    def state_badge(self, obj: GPU) -> str:
        return _badge(obj.state)

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        count = services.gpus_drain(gpus=queryset, actor=request.user)
        self.message_user(request, f"Draining {count} GPU(s).", messages.SUCCESS)

    @admin.action(description="Undrain: return drained or failed GPUs to service")
    def undrain(self, request, queryset):
        count = services.gpus_undrain(gpus=queryset, actor=request.user)
        self.message_user(request, f"Returned {count} GPU(s) to service.", messages.SUCCESS)


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = ["attempt", "gpu", "memory_mb", "exclusive", "started_at", "released_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class TaskEventInline(admin.TabularInline):
    model = TaskEvent
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "attempt", "reason", "actor"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "tenant",
        "state_badge",
        "priority",
        "task_class",
        "queue",
        "gpus",
        "node",
        "attempt",
        "submitted_at",
        "reason",
    ]
    list_filter = ["state", "task_class", "tenant", "pool", "node"]
    search_fields = ["=id", "name", "queue", "command", "tenant__name", "owner__username"]
    list_select_related = ["tenant", "node"]
    date_hierarchy = "submitted_at"
    raw_id_fields = ["depends_on"]
    inlines = [AllocationInline, TaskEventInline]
    # State changes go through the state machine (services), never through a form.
    readonly_fields = [
        "tenant",
        "owner",
        "state",
        "reason",
        "node",
        "attempt",
        "infra_requeues",
        "exit_code",
        "spec",
        "submitted_at",
        "scheduled_at",
        "started_at",
        "finished_at",
        "updated_at",
    ]

    @admin.display(description="GPUs")
    def gpus(self, obj: Task) -> str:
        count = (
            str(obj.gpus_min) if obj.gpus_min == obj.gpus_max else f"{obj.gpus_min}-{obj.gpus_max}"
        )
        if obj.gpu_memory_mb:
            return f"{count} x {format_memory_mb(obj.gpu_memory_mb)}"
        return count

    @admin.display(ordering="state", description="state")
    def state_badge(self, obj: Task) -> str:
        return _badge(obj.state)


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["task", "attempt", "gpu", "memory_mb", "exclusive", "started_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "exclusive", "gpu__node"]
    search_fields = ["=task__id", "task__name", "gpu__uuid"]
    list_select_related = ["task", "gpu__node"]
    readonly_fields = [
        "task",
        "attempt",
        "gpu",
        "memory_mb",
        "exclusive",
        "started_at",
        "released_at",
    ]

    def has_add_permission(self, request) -> bool:
        return False  # only the scheduler allocates


@admin.register(TaskEvent)
class TaskEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "task", "from_state", "to_state", "attempt", "actor", "reason"]
    list_filter = ["to_state", "from_state"]
    search_fields = ["=task__id", "task__name", "reason"]
    list_select_related = ["task", "actor"]
    date_hierarchy = "at"

    # The audit trail is append-only (ReadOnlyAdmin).


@admin.register(SchedulerState)
class SchedulerStateAdmin(ReadOnlyAdmin):
    """How scheduling passes go: read-only, with an action to run one now."""

    list_display = ["passes", "last_pass_at", "last_pass_took", "last_placed", "last_preempted",
                    "last_waiting", "pass_queued"]  # fmt: skip
    fields = ["pass_queued", "passes", "last_pass_at", "last_pass_took", "last_placed",
              "last_preempted", "last_waiting"]  # fmt: skip
    readonly_fields = fields
    actions = ["run_pass_now"]

    @admin.display(description="last pass took", ordering="last_pass_ms")
    def last_pass_took(self, state: SchedulerState) -> str | None:
        # A float's repr (193.39962000003652) is noise; a tenth of a millisecond is plenty.
        return None if state.last_pass_ms is None else f"{state.last_pass_ms:.1f} ms"

    @admin.action(description="Run a scheduling pass now")
    def run_pass_now(self, request, queryset):
        result = scheduler.schedule_pass()
        self.message_user(
            request,
            f"Pass done in {result.ms:.0f} ms: {len(result.placed)} placed, "
            f"{len(result.preempted)} preempted, {result.waiting} waiting.",
            messages.SUCCESS,
        )


_BADGE_COLOURS = {
    "available": "#2e7d32",
    "running": "#2e7d32",
    "succeeded": "#2e7d32",
    "draining": "#ef6c00",
    "paused": "#ef6c00",
    "pending": "#1565c0",
    "scheduled": "#1565c0",
    "preempted": "#ef6c00",
    "offline": "#757575",
    "cancelled": "#757575",
    "failed": "#c62828",
    "lost": "#c62828",
    "timed_out": "#c62828",
}


def _badge(state: str) -> str:
    return format_html(
        '<span style="color:#fff;background:{};padding:1px 6px;border-radius:3px">{}</span>',
        _BADGE_COLOURS.get(state, "#555"),
        state.replace("_", " "),
    )
