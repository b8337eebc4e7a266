from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from gpuplatform.admin import ReadOnlyAdmin, ReadOnlyInline
from gpuplatform.units import format_memory_mb
from scheduling import controls, scheduler, services
from scheduling.admin_forms import PriorityForm, SubmitForTenantForm
from scheduling.agentapi.messages import SINGLE_USER_NOTE
from scheduling.models import (
    GPU,
    Allocation,
    GpuState,
    Node,
    NodeState,
    PassRequest,
    Pool,
    SchedulerState,
    Successor,
    Task,
    TaskAttempt,
    TaskEvent,
)
from scheduling.spec import SpecError
from scheduling.submission import tasks_submit


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
    # What fits beside the sidebar and the filters at 1280 px: the reason under the state, the
    # backend as a filter (and on each node's page).
    list_display = [
        "name",
        "pool",
        "state_with_reason",
        "gpu_count",
        "hostname",
        "heartbeat_age",
        "isolation",
    ]
    list_filter = ["state", "pool", "backend"]
    search_fields = ["name", "hostname"]
    list_select_related = ["pool"]
    # A node is what its agent registers (name, pool, host); its state changes through the
    # drain and undrain actions (the services the API calls) or what the agent reports.
    readonly_fields = [
        "name",
        "pool",
        "state",
        "state_reason",
        "resume_state",
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

    def has_add_permission(self, request) -> bool:
        return False  # nodes register through their agent (node_register)

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
    def state_with_reason(self, obj: Node) -> str:
        if not obj.state_reason:
            return _badge(obj.state)
        return format_html('{}<div class="help">{}</div>', _badge(obj.state), obj.state_reason)

    @admin.display(ordering="last_heartbeat", description="last heartbeat")
    def heartbeat_age(self, obj: Node) -> str:
        return _age(obj.last_heartbeat)

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        count = services.nodes_drain(nodes=queryset, actor=request.user)
        _report(self, request, queryset, count, "Draining {} node(s).", NodeState.DRAINING,
                "only an available node can be drained")  # fmt: skip

    @admin.action(description="Undrain: return drained nodes to service")
    def undrain(self, request, queryset):
        count = services.nodes_undrain(nodes=queryset, actor=request.user)
        _report(self, request, queryset, count, "Returned {} node(s) to service.",
                NodeState.AVAILABLE, "only a draining node can be undrained")  # fmt: skip


@admin.register(GPU)
class GpuAdmin(admin.ModelAdmin):
    # What fits beside the sidebar and the filters at 1280 px: the model, UUID and PCI bus id
    # are on each GPU's page (and searchable), times as ages.
    list_display = [
        "__str__",
        "gpu_type",
        "memory",
        "state_badge",
        "active_allocations",
        "foreign_memory",
        "seen",
    ]
    list_filter = ["state", "gpu_type", "node__pool", "node"]
    search_fields = ["uuid", "model", "gpu_type", "node__name", "pci_bus_id"]
    list_select_related = ["node"]
    readonly_fields = [
        "node",
        "index",
        "uuid",
        "model",
        "gpu_type",
        "state",
        "state_reason",
        "resume_state",
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

    @admin.display(ordering="foreign_memory_mb", description="foreign memory")
    def foreign_memory(self, obj: GPU) -> str:
        return format_memory_mb(obj.foreign_memory_mb)

    @admin.display(ordering="last_seen_at", description="last seen")
    def seen(self, obj: GPU) -> str:
        return _age(obj.last_seen_at)

    @admin.display(ordering="state", description="state")
    def state_badge(self, obj: GPU) -> str:
        return _badge(obj.state)

    @admin.action(description="Drain: finish running work, place nothing new")
    def drain(self, request, queryset):
        count = services.gpus_drain(gpus=queryset, actor=request.user)
        _report(self, request, queryset, count, "Draining {} GPU(s).", GpuState.DRAINING,
                "only an available GPU can be drained")  # fmt: skip

    @admin.action(description="Undrain: return drained or failed GPUs to service")
    def undrain(self, request, queryset):
        count = services.gpus_undrain(gpus=queryset, actor=request.user)
        _report(self, request, queryset, count, "Returned {} GPU(s) to service.",
                GpuState.AVAILABLE, "only a draining or failed GPU can be undrained")  # fmt: skip


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = ["attempt", "gpu", "memory_mb", "exclusive", "started_at", "released_at"]


class TaskAttemptInline(ReadOnlyInline):
    model = TaskAttempt
    fields = ["number", "node", "gpu_uuids", "started_at", "ended_at", "exit_code", "outcome",
              "stop_requested", "pid", "log_path"]  # fmt: skip


class EventReason:
    """An event's reason in the operator's language (``scheduling.reasons``)."""

    @admin.display(description="reason")
    def reason_shown(self, obj: TaskEvent) -> str:
        return obj.reason_text


class TaskEventInline(EventReason, ReadOnlyInline):
    model = TaskEvent
    fields = ["at", "from_state", "to_state", "attempt", "reason_shown", "actor"]
    readonly_fields = ["reason_shown"]


class TaskChangeList(ChangeList):
    """Looks up the listed pending tasks' places in line in one query (``Task.reason_text``)."""

    def get_results(self, request) -> None:
        super().get_results(request)
        Task.attach_places(self.result_list)


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    """Tasks as history: read-only pages. A task is created only by the submit service (the
    "submit for a tenant" form replaces the add form) and changed only by the services the API
    calls (the actions), so the admin keeps every rule the API keeps."""

    list_display = [
        "id",
        "name",
        "tenant",
        "state_with_reason",
        "priority",
        "gpus",
        "node",
    ]
    list_filter = ["state", "task_class", "tenant", "pool", "node"]
    search_fields = ["=id", "name", "queue", "command", "tenant__name", "owner__username"]
    list_select_related = ["tenant", "node"]
    date_hierarchy = "submitted_at"
    inlines = [TaskAttemptInline, AllocationInline, TaskEventInline]
    fieldsets = [
        (None, {"fields": ["name", "tenant", "owner", "state", "why", "hold_reason"]}),
        ("Request", {"fields": ["task_class", "priority", "preemptible", "queue", "command",
                                "workdir", "env", "spec"]}),
        ("Resources", {"fields": ["gpus_min", "gpus_max", "gpu_memory_mb", "gpu_type", "pool",
                                  "required_node"]}),
        ("Policy", {"fields": ["timeout_s", "retries", "depends_on", "not_before"]}),
        ("Progress", {"fields": ["node", "attempt", "infra_requeues", "exit_code",
                                 "submitted_at", "scheduled_at", "started_at", "finished_at",
                                 "updated_at"]}),
    ]  # fmt: skip
    actions = ["cancel", "pause", "resume", "retry", "change_priority"]

    def has_add_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("scheduling.add_task")

    def has_control_permission(self, request) -> bool:
        return request.user.has_perm("scheduling.change_task")

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

    @admin.display(ordering="state", description="state")
    def state_with_reason(self, obj: Task) -> str:
        """The state and, beneath it, why (one column: the list fits 1280 px beside the
        navigation and the filters, as the node list does)."""
        reason = obj.reason_text
        if not reason:
            return _badge(obj.state)
        return format_html('{}<div class="help">{}</div>', _badge(obj.state), reason)

    @admin.display(description="reason")
    def why(self, obj: Task) -> str:
        return obj.reason_text

    def get_changelist(self, request, **kwargs):
        return TaskChangeList

    # --- Submitting for a tenant ---------------------------------------------------------------

    def add_view(self, request, form_url="", extra_context=None):
        """Submit on behalf of a tenant, through tasks_submit like the API and the CLI."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = SubmitForTenantForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                tasks = tasks_submit(
                    tenant=data["tenant"], specs=data["specs"], owner=data["owner"],
                    by=request.user,
                )  # fmt: skip
            except SpecError as exc:
                form.add_refusal(exc)
            else:
                return self._submitted(request, tasks, data["tenant"], data["owner"])
        context = {
            **self.admin_site.each_context(request),
            "title": "Submit a task for a tenant",
            "opts": self.opts,
            "form": form,
            "media": self.media + form.media,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/scheduling/task/submit.html", context)

    def _submitted(self, request, tasks: list[Task], tenant, owner) -> HttpResponseRedirect:
        names = ", ".join(f"#{t.pk} {t.name}" for t in tasks[:10])
        more = f" and {len(tasks) - 10} more" if len(tasks) > 10 else ""
        self.message_user(
            request,
            f"Submitted {names}{more} for {tenant.name}, owned by {owner.get_username()}.",
            messages.SUCCESS,
        )
        if len(tasks) == 1:
            return HttpResponseRedirect(reverse("admin:scheduling_task_change", args=[tasks[0].pk]))
        return HttpResponseRedirect(
            f"{reverse('admin:scheduling_task_changelist')}?tenant__id__exact={tenant.pk}"
        )

    # --- Actions: the services the API's control endpoints call --------------------------------

    @admin.action(description="Cancel the selected tasks", permissions=["control"])
    def cancel(self, request, queryset):
        self._control(request, queryset, "cancel", "Cancelled (or stopping)")

    @admin.action(description="Pause the selected tasks", permissions=["control"])
    def pause(self, request, queryset):
        self._control(request, queryset, "pause", "Paused")

    @admin.action(description="Resume the selected paused tasks", permissions=["control"])
    def resume(self, request, queryset):
        self._control(request, queryset, "resume", "Resumed")

    @admin.action(
        description="Retry the selected tasks (or release held ones)", permissions=["control"]
    )
    def retry(self, request, queryset):
        self._control(request, queryset, "retry", "Retried")

    def _control(self, request, queryset, action: str, done: str) -> None:
        result = controls.tasks_control(
            tasks=queryset.order_by("pk"), action=action, by=request.user
        )
        if result.done:
            self.message_user(request, f"{done}: {len(result.done)} task(s).", messages.SUCCESS)
        self._refusals(request, [f"#{task.pk} {task.name}: {why}" for task, why in result.refused])

    @admin.action(description="Change the priority of the selected tasks", permissions=["control"])
    def change_priority(self, request, queryset):
        form = PriorityForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            context = {
                **self.admin_site.each_context(request),
                "title": "Change the priority of tasks",
                "opts": self.opts,
                "form": form,
                "tasks": queryset.order_by("pk"),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/scheduling/task/change_priority.html", context)
        changed, refused = 0, []
        for task in queryset.order_by("pk"):
            try:
                services.task_set_priority(
                    task=task, priority=form.cleaned_data["priority"], by=request.user
                )
            except services.ChangeRefused as exc:
                refused.append(f"#{task.pk} {task.name}: {exc}")
            else:
                changed += 1
        if changed:
            self.message_user(
                request,
                f"Priority {form.cleaned_data['priority']}: {changed} task(s).",
                messages.SUCCESS,
            )
        self._refusals(request, refused)
        return None

    def _refusals(self, request, refused: list[str]) -> None:
        """One message per refused task (an illegal move, a quota), up to ten."""
        for line in refused[:10]:
            self.message_user(request, line, messages.ERROR)
        if len(refused) > 10:
            self.message_user(request, f"... and {len(refused) - 10} more refused.", messages.ERROR)


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdmin):
    """Only the scheduler allocates; the rows are history."""

    list_display = ["task", "attempt", "gpu", "memory_mb", "exclusive", "started_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter), "exclusive", "gpu__node"]
    search_fields = ["=task__id", "task__name", "gpu__uuid"]
    list_select_related = ["task", "gpu__node"]


@admin.register(TaskEvent)
class TaskEventAdmin(EventReason, ReadOnlyAdmin):
    list_display = ["at", "task", "from_state", "to_state", "attempt", "actor", "reason_shown"]
    list_filter = ["to_state", "from_state"]
    search_fields = ["=task__id", "task__name", "reason"]
    list_select_related = ["task", "actor"]
    date_hierarchy = "at"

    # The audit trail is append-only (ReadOnlyAdmin).


@admin.register(Successor)
class SuccessorAdmin(ReadOnlyAdmin):
    """The passes' lists of successors (``launcher.handoff``): who takes the next GPUs that
    free up, newest list first. Read-only: each pass writes its own."""

    list_display = [
        "rank",
        "task",
        "gpus",
        "may_take",
        "fenced",
        "swap_tenant",
        "generation",
        "listed",
    ]
    list_select_related = ["task"]
    ordering = ["-generation", "rank"]
    fields = ["generation", "rank", "listed", "task", "gpus", "may_take", "fenced", "swap_tenant"]
    readonly_fields = fields

    @admin.display(description="may take")
    def may_take(self, successor: Successor) -> str:
        return (
            f"{len(successor.gpu_ids)} GPU(s): "
            + ", ".join(map(str, successor.gpu_ids[:16]))
            + (", ..." if len(successor.gpu_ids) > 16 else "")
        )


@admin.register(SchedulerState)
class SchedulerStateAdmin(ReadOnlyAdmin):
    """How scheduling passes go: read-only, with an action to run one now."""

    list_display = ["passes", "last_pass_at", "last_pass_took", "last_placed", "last_preempted",
                    "last_waiting", "last_idle_gpus", "pass_queued"]  # fmt: skip
    fields = ["pass_queued", "passes", "last_pass_at", "last_pass_took", "last_placed",
              "last_preempted", "last_waiting", "last_idle_gpus"]  # fmt: skip
    readonly_fields = fields
    actions = ["run_pass_now"]

    @admin.display(description="last pass took", ordering="last_pass_ms")
    def last_pass_took(self, state: SchedulerState) -> str | None:
        # A float's repr (193.39962000003652) is noise; a tenth of a millisecond is plenty.
        return None if state.last_pass_ms is None else f"{state.last_pass_ms:.1f} ms"

    @admin.display(description="pass queued", boolean=True)
    def pass_queued(self, state: SchedulerState) -> bool:
        return PassRequest.objects.filter(pk=1, queued=True).exists()

    @admin.action(description="Run a scheduling pass now")
    def run_pass_now(self, request, queryset):
        result = scheduler.schedule_pass()
        self.message_user(
            request,
            f"Pass done in {result.ms:.0f} ms: {len(result.placed)} placed, "
            f"{len(result.preempted)} preempted, {result.waiting} waiting.",
            messages.SUCCESS,
        )


def _report(model_admin, request, queryset, count: int, done: str, wanted: str, rule: str) -> None:
    """Say what a drain or undrain changed, and name each selected row it left as it was."""
    if count:
        model_admin.message_user(request, done.format(count), messages.SUCCESS)
    for obj in queryset.model._default_manager.filter(pk__in=queryset.values("pk")):
        if obj.state != wanted:
            model_admin.message_user(
                request, f"{obj} is {obj.state}, left as it was: {rule}.", messages.WARNING
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


def _age(at) -> str:
    if at is None:
        return "never"
    seconds = int((timezone.now() - at).total_seconds())
    return f"{seconds} s ago" if seconds < 60 else f"{timesince(at, depth=1)} ago"


def _badge(state: str) -> str:
    return format_html(
        '<span style="color:#fff;background:{};padding:1px 6px;border-radius:3px">{}</span>',
        _BADGE_COLOURS.get(state, "#555"),
        state.replace("_", " "),
    )
