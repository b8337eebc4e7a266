"""The tasks and inventory API under /api/v1/. Every query starts from the caller's tenant."""

from __future__ import annotations

import contextlib

from django.db import transaction
from django.db.models import Manager, QuerySet
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import generics, serializers, status
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform import query
from gpuplatform.api import IsOperator, IsTenantMember, errors_response, request_tenant
from gpuplatform.api_defaults import Page
from gpuplatform.query import BIGINT_MAX, INT_MAX, WholeNumber
from scheduling import controls, idempotency, logs, logwait, selectors, services, serviceurl
from scheduling.api_rows import gpus_range, submitted_data, task_rows
from scheduling.api_service import ServiceOut, service_data
from scheduling.models import (
    GPU,
    Node,
    Pool,
    Task,
    TaskEvent,
)
from scheduling.policy.model import free_memory_mb
from scheduling.spec import parse_specs, parse_yaml
from scheduling.spec.reference import SubmissionInput, openapi_schema
from scheduling.states import TaskState
from scheduling.submission import tasks_submit
from tenants.roles import Action


class YamlParser(BaseParser):
    """Task specs as YAML (several documents allowed); parsed by scheduling.spec."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read().decode("utf-8", errors="replace")


class TextYamlParser(YamlParser):
    media_type = "text/yaml"


class SubmissionSchema(OpenApiSerializerExtension):
    """A submission's request body as the spec's schema declares it (scheduling.spec.schema):
    its models become components (TaskInput, SweepInput, ...)."""

    target_class = SubmissionInput
    priority = 1  # ahead of drf-spectacular's own pydantic extension (it documents answers)

    def get_name(self, auto_schema, direction):
        return "Submission"

    def map_serializer(self, auto_schema, direction):
        schema, models = openapi_schema("#/components/schemas/{model}")
        for name, model in models.items():
            component = ResolvedComponent(
                name=name, type=ResolvedComponent.SCHEMA, object=name, schema=model
            )
            auto_schema.registry.register_on_missing(component)
        return schema


# --- Serializers -------------------------------------------------------------------------------


class TaskListOut(serializers.ListSerializer):
    """Looks up the pending tasks' places in line in one query for the whole list (the
    operators' list). The tenant's task list does not come here: its pages are built from the
    columns (``task_rows``), and a submission's answer directly (``submitted_data``)."""

    def to_representation(self, data):
        tasks = list(data.all() if isinstance(data, Manager) else data)
        Task.attach_places(tasks)
        return super().to_representation(tasks)


class TaskOut(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", default=None, allow_null=True)
    owner = serializers.CharField(source="owner.username", default=None, allow_null=True)
    task_class = serializers.CharField()
    gpus = serializers.SerializerMethodField()
    reason = serializers.CharField(
        source="reason_text",
        read_only=True,
        help_text="Why it waits (with its place in line), or how it ended, in the language of "
        "the request's Accept-Language (English by default).",
    )
    reason_code = serializers.CharField(
        read_only=True,
        help_text="The reason as data: its code (see docs/api.md), empty where the reason is "
        "text only (a pass's wait, whose data is `wait`; rows older than the codes).",
    )
    reason_params = serializers.DictField(
        read_only=True,
        help_text="The reason's parameters by name; `notes`: further reasons ({code, params}) "
        "that end it; a parameter may itself be a reason.",
    )

    class Meta:
        list_serializer_class = TaskListOut
        model = Task
        fields = [
            "id",
            "name",
            "state",
            "reason",
            "reason_code",
            "reason_params",
            "queue",
            "priority",
            "task_class",
            "gpus",
            "gpu_memory_mb",
            "node",
            "owner",
            "attempt",
            "exit_code",
            "submitted_at",
            "started_at",
            "finished_at",
        ]

    def get_gpus(self, task: Task) -> str:
        return gpus_range(task.gpus_min, task.gpus_max)


class TaskSubmitted(TaskOut):
    warnings = serializers.SerializerMethodField(
        help_text="What the submission may not have meant, e.g. a queue name this tenant never "
        "used before (a misspelt queue silently starts a new serial queue). The task was "
        "submitted all the same."
    )

    class Meta(TaskOut.Meta):
        fields = [*TaskOut.Meta.fields, "warnings"]

    def get_warnings(self, task: Task) -> list[str]:
        return self.context.get("warnings", {}).get(task.pk, [])


class AttemptOut(serializers.Serializer):
    number = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    gpu_uuids = serializers.ListField(child=serializers.CharField())
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    outcome = serializers.CharField()


class WaitOut(serializers.Serializer):
    code = serializers.CharField(
        help_text="queue, held, dependencies, backoff, quota, capacity, reserved, preempting"
    )
    position = serializers.IntegerField(
        allow_null=True, help_text="Place in line among the tasks that wait for GPUs or quota."
    )
    line = serializers.IntegerField(allow_null=True, help_text="How many wait in that line.")
    details = serializers.DictField(help_text="The figures behind the reason, by code.")


class ExpectedStartOut(serializers.Serializer):
    at = serializers.DateTimeField(
        allow_null=True, help_text="When it is expected to start; null when unknown."
    )
    earliest = serializers.DateTimeField(
        allow_null=True, help_text="The start if the tasks ahead end as soon as they usually do."
    )
    latest = serializers.DateTimeField(
        allow_null=True,
        help_text="The start if they run as long as they usually do at most (or to their "
        "timeouts); null when nothing bounds it.",
    )
    basis = serializers.CharField(
        help_text="What the estimate rests on, the weakest source used: now (GPUs that fit it "
        "are free), command (the runtimes of the tenant's succeeded tasks with the same "
        "command), tenant (the tenant's succeeded tasks), platform (every tenant's), timeout "
        "(the timeouts of the tasks ahead only); unknown (nothing to go by, or not in line for "
        "GPUs), later (beyond the first tasks in line a pass estimates)."
    )
    text = serializers.CharField(help_text="The estimate in a sentence, in the caller's language.")


class TaskDetail(TaskOut):
    position = serializers.SerializerMethodField(help_text="Place in line while pending.")
    expected_start = serializers.SerializerMethodField(
        help_text="While pending: when it is expected to start, with bounds, as the last "
        "scheduling pass estimated it from the running tasks' and the line's typical runtimes "
        "(history) or timeouts; null otherwise."
    )
    wait = serializers.SerializerMethodField(
        help_text="While pending: why it waits, as data (the `reason` is rendered from it); "
        "null otherwise, or until the next scheduling pass has looked at it."
    )
    gpu_uuids = serializers.SerializerMethodField(help_text="GPUs it holds now.")
    service_url = serializers.SerializerMethodField(
        help_text="A service's address through the platform (`/services/<id>/`, absolute "
        "when the request named a host): members of the tenant open it with their session or "
        "token. Null for a task that is not a service."
    )
    health = serializers.SerializerMethodField(
        help_text="A running service's health check: starting, healthy, unhealthy; empty "
        "without a health check or when not running."
    )
    attempts = AttemptOut(many=True, read_only=True)
    depends_on = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    pool = serializers.CharField(source="pool.name", default=None, allow_null=True)
    service = serializers.SerializerMethodField(
        help_text="A service's port, health and replicas (the spec's service block); null "
        "for other tasks."
    )

    class Meta(TaskOut.Meta):
        fields = [
            *TaskOut.Meta.fields,
            "position",
            "expected_start",
            "wait",
            "gpu_uuids",
            "service_url",
            "health",
            "attempts",
            "command",
            "workdir",
            "env",
            "spec",
            "gpu_type",
            "pool",
            "required_node",
            "timeout_s",
            "retries",
            "preemptible",
            "depends_on",
            "scheduled_at",
            "infra_requeues",
            "hold_reason",
            "not_before",
            "service",
        ]

    @extend_schema_field(ServiceOut(allow_null=True))
    def get_service(self, task: Task) -> dict | None:
        data = service_data(task, getattr(task, "service_group", []))
        return None if data is None else ServiceOut(data).data

    def get_position(self, task: Task) -> int | None:
        place = task.place
        return place[0] if place else None

    @extend_schema_field(ExpectedStartOut(allow_null=True))
    def get_expected_start(self, task: Task) -> dict | None:
        start = task.expected_start
        return None if start is None else ExpectedStartOut(start).data

    @extend_schema_field(WaitOut(allow_null=True))
    def get_wait(self, task: Task) -> dict | None:
        view = task.wait_view
        return None if view is None else WaitOut(view).data

    def get_gpu_uuids(self, task: Task) -> list[str]:
        return [a.gpu.uuid for a in task.allocations.all() if a.released_at is None]

    def get_service_url(self, task: Task) -> str | None:
        path = serviceurl.service_path(task)
        request = self.context.get("request")
        if path is None or request is None:
            return path
        return request.build_absolute_uri(path)

    def get_health(self, task: Task) -> str:
        return serviceurl.service_health(task)


class EventOut(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", default=None, allow_null=True)
    reason = serializers.CharField(
        source="reason_text",
        read_only=True,
        help_text="In the language of the request's Accept-Language (English by default).",
    )
    reason_code = serializers.CharField(read_only=True)
    reason_params = serializers.DictField(read_only=True)

    class Meta:
        model = TaskEvent
        fields = [
            "at",
            "from_state",
            "to_state",
            "reason",
            "reason_code",
            "reason_params",
            "attempt",
            "actor",
        ]


class LogOut(serializers.Serializer):
    attempt = serializers.IntegerField()
    offset = serializers.IntegerField(help_text="Byte offset of `text` in the log.")
    next_offset = serializers.IntegerField(help_text="Pass as `offset` to read what follows.")
    size = serializers.IntegerField()
    text = serializers.CharField()
    finished = serializers.BooleanField(help_text="The attempt ended: nothing more will come.")


# --- Tasks -------------------------------------------------------------------------------------


def tenant_tasks(request: Request) -> QuerySet[Task]:
    return selectors.task_list(tenant=request_tenant(request).tenant)


def get_task_for(request: Request, pk: int) -> Task:
    """The caller's task, or 404 (another tenant's task is never revealed)."""
    return selectors.task_get(tenant=request_tenant(request).tenant, pk=pk)


class TaskInPath:
    """A view of one of the caller's tasks (``pk``): another tenant's is a 404 whatever the
    method, one the view does not handle included (gpuplatform.api.IsTenantMember)."""

    def tenant_object(self) -> Task:
        return get_task_for(self.request, self.kwargs["pk"])


class StatesField(serializers.CharField):
    """Comma-separated task states: a typo is a 400 naming it, not a silently empty list."""

    def __init__(self, **kwargs) -> None:
        super().__init__(required=False, allow_blank=True, help_text="comma-separated states",
                         **kwargs)  # fmt: skip

    def to_internal_value(self, data) -> list[str] | None:
        raw = super().to_internal_value(data)
        if not raw:
            return None
        wanted = raw.split(",")
        known = [s.value for s in TaskState]
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise serializers.ValidationError(
                f"unknown state {unknown[0]!r}; expected some of {', '.join(known)}"
            )
        return wanted


class TaskListQuery(serializers.Serializer):
    """The task list's filters (selectors.TaskListing); empty ones filter nothing."""

    state = StatesField(source="states")
    queue = serializers.CharField(required=False, allow_blank=True)
    name = serializers.CharField(
        source="name_contains", required=False, allow_blank=True, help_text="name contains"
    )
    submitted_after = serializers.DateTimeField(required=False, help_text="inclusive")
    submitted_before = serializers.DateTimeField(required=False)


class PagedGetSchema(AutoSchema):
    """Only GET pages: the POST beside it answers a plain array, which drf-spectacular would
    otherwise document as the GET's page ({count, next, previous, results}) with its limit and
    offset parameters."""

    def _get_paginator(self):
        return super()._get_paginator() if self.method == "GET" else None


class TaskPage(Page):
    """The task lists' pages: ``count`` is exact while it is at most COUNTED_PAST tasks past
    the end of the page, and beyond that the number counted so far, with ``count_exact`` false
    (a history can hold millions of tasks: counting them all was most of a page's cost).
    ``next`` is there whenever more tasks follow, either way. Pages a selectors.TaskListing
    or a queryset."""

    COUNTED_PAST = 10_000

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.limit, self.offset = self.get_limit(request), self.get_offset(request)
        # Counted up to a bigint at most (PostgreSQL's LIMIT), however far the offset.
        bound = min(self.offset + self.limit + self.COUNTED_PAST, BIGINT_MAX - 1)
        # One more than the bound tells "exactly" from "more".
        if isinstance(queryset, QuerySet):
            counted = queryset[: bound + 1].count()  # SELECT count(*) FROM (... LIMIT n)
        else:
            counted = queryset.count(at_most=bound + 1)
        self.count, self.count_exact = min(counted, bound), counted <= bound
        if self.count <= self.offset:
            return []
        return list(queryset[self.offset : self.offset + self.limit])

    def get_paginated_response(self, data):
        return Response(
            {
                "count": self.count,
                "count_exact": self.count_exact,
                "next": self.get_next_link(),
                "previous": self.get_previous_link(),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema):
        paged = super().get_paginated_response_schema(schema)
        paged["properties"]["count_exact"] = {
            "type": "boolean",
            "description": f"false when more than {self.COUNTED_PAST:,} tasks follow the page: "
            "count is then how many were counted, a lower bound",
        }
        paged["required"] = [*paged.get("required", []), "count_exact"]
        return paged


class TaskList(generics.ListAPIView):
    """List your tenant's tasks (newest first); submit tasks as JSON or YAML."""

    schema = PagedGetSchema()
    pagination_class = TaskPage
    permission_classes = [IsTenantMember]
    tenant_actions = {"POST": Action.SUBMIT}
    serializer_class = TaskOut
    parser_classes = [JSONParser, YamlParser, TextYamlParser]

    @extend_schema(parameters=[TaskListQuery])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def list(self, request, *args, **kwargs):
        # The page as rows of the columns TaskOut shows (selectors.TaskListing, task_rows),
        # where DRF's list would build a Task, a Node and a User for each of its tasks.
        rows = self.paginate_queryset(self.listing())
        return self.get_paginated_response(task_rows(rows))

    def listing(self) -> selectors.TaskListing:
        """The caller's tasks with the filters of the query string; a bad one is a 400."""
        filters = query.parse(TaskListQuery, self.request.query_params)
        return selectors.TaskListing(tenant=request_tenant(self.request).tenant, **filters)

    def get_queryset(self) -> QuerySet[Task]:
        # What the schema and DRF's own machinery see; the list reads through listing().
        if getattr(self, "swagger_fake_view", False):
            return Task.objects.none()
        return tenant_tasks(self.request)

    @extend_schema(
        request={"application/json": SubmissionInput, "application/yaml": OpenApiTypes.STR},
        responses={201: TaskSubmitted(many=True)},  # a plain array (see PagedGetSchema)
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def post(self, request: Request) -> Response:
        """Submit one spec, a list of specs, a sweep, or YAML with several documents."""
        caller = request_tenant(request)
        key = request.headers.get("Idempotency-Key", "")
        if len(key) > 200:
            return errors_response({"Idempotency-Key": ["at most 200 characters"]})
        body = request.body
        # Without a key, tasks_submit's own transaction is the only one (no savepoint: two
        # round trips fewer per submission); with one, the key's row commits with the tasks.
        with transaction.atomic() if key else contextlib.nullcontext():
            if key:
                replay = _idempotent_replay(caller.tenant, key, body)
                if replay is not None:
                    return replay
            specs = self.parse_specs(request)
            new_queues = selectors.queues_new_for_tenant(
                tenant=caller.tenant, names=(spec.queue for spec in specs)
            )
            tasks = tasks_submit(tenant=caller.tenant, specs=specs, owner=request.user)
            warnings = _new_queue_warnings(caller.tenant, tasks, new_queues)
            data = submitted_data(tasks, warnings)
            if key:
                idempotency.idempotency_record(
                    tenant=caller.tenant, key=key, status=201, response=data
                )
        return Response(data, status=status.HTTP_201_CREATED)

    def parse_specs(self, request: Request):
        # How many tasks one submission may hold is the submit service's rule (tasks_submit).
        if isinstance(request.data, str):
            return parse_yaml(request.data)
        return parse_specs(request.data)


def _new_queue_warnings(
    tenant, tasks: list[Task], new_queues: dict[str, list[str]]
) -> dict[int, list[str]]:
    """A warning on the first task of each queue the tenant never used before."""
    warnings: dict[int, list[str]] = {}
    for task in tasks:
        if task.queue not in new_queues:
            continue
        similar = new_queues.pop(task.queue)
        text = (
            f"queue {task.queue!r} is new for tenant {tenant.name}: it starts a serial queue of "
            "its own"
        )
        if similar:
            text += f"; did you mean {' or '.join(repr(name) for name in similar)}?"
        warnings[task.pk] = [text]
    return warnings


def _idempotent_replay(tenant, key: str, body: bytes) -> Response | None:
    """The first answer again for a key used before (409 for another body); None for a new
    key, now claimed for this request."""
    try:
        earlier = idempotency.idempotency_claim(tenant=tenant, key=key, body=body)
    except idempotency.KeyReused as exc:
        return errors_response({"Idempotency-Key": [str(exc)]}, code=409)
    if earlier is None:
        return None
    response = Response(earlier.response, status=earlier.status)
    response["Idempotent-Replayed"] = "true"
    return response


class TaskDetailView(TaskInPath, generics.RetrieveAPIView):
    """One task: state, why it waits and where it stands, GPUs, node, attempts, exit code."""

    permission_classes = [IsTenantMember]
    serializer_class = TaskDetail

    def get_object(self) -> Task:
        return selectors.task_detail(
            tenant=request_tenant(self.request).tenant, pk=self.kwargs["pk"]
        )


class TaskEvents(TaskInPath, generics.ListAPIView):
    """The task's state changes, oldest first."""

    permission_classes = [IsTenantMember]
    serializer_class = EventOut

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return TaskEvent.objects.none()
        tenant = request_tenant(self.request).tenant
        return selectors.task_events(tenant=tenant, pk=self.kwargs["pk"])


class LogQuery(serializers.Serializer):
    attempt = WholeNumber(maximum=INT_MAX, required=False, help_text="default: the latest")
    offset = WholeNumber(required=False, help_text="byte offset to read from")
    tail = WholeNumber(maximum=INT_MAX, required=False, help_text="only the last N lines")
    limit = WholeNumber(required=False, help_text=f"bytes, at most {logs.MAX_READ}")
    wait = WholeNumber(maximum=logs.MAX_WAIT_S, required=False, help_text=logwait.HELP)


class TaskLog(TaskInPath, APIView):
    """Read an attempt's output: from a byte offset (follow with `next_offset`), or its tail.
    With `wait`, a read with nothing new yet answers when bytes come or the attempt ends.
    503 with `unavailable: true` and the reason when the node holding the log cannot be
    reached."""

    permission_classes = [IsTenantMember]

    @extend_schema(parameters=[LogQuery], responses={200: LogOut, 503: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: int) -> Response:
        task = get_task_for(request, pk)
        params = query.parse(LogQuery, request.query_params)
        wait = params.pop("wait", 0)
        try:
            chunk = logs.read(task, **params)
        except logs.NoLog as exc:
            return errors_response({"attempt": [str(exc)]}, code=404)
        except logs.LogUnavailable as exc:
            # Said as it is: a log that cannot be read now is not an empty one.
            answer = errors_response({"attempt": [f"log unavailable: {exc}"]}, code=503)
            answer.data["unavailable"] = True
            answer["Retry-After"] = "1"
            return answer
        if wait and "offset" in params and logwait.nothing_new(chunk):  # wait off the thread
            body = logwait.later(task, params, chunk, wait, lambda c: LogOut(c).data)
            return StreamingHttpResponse(body, content_type="application/json")
        return Response(LogOut(chunk).data)


class TaskControl(TaskInPath, APIView):
    """Cancel, pause, resume or retry a task: a member its own tasks, a tenant admin any task of
    the tenant (403 otherwise). Refused with 409 when its state does not allow."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"POST": Action.CONTROL_TASK}
    action = ""

    @extend_schema(request=None, responses={200: TaskDetail, 409: OpenApiTypes.OBJECT})
    def post(self, request: Request, pk: int) -> Response:
        task = get_task_for(request, pk)
        request_tenant(request).require(Action.CONTROL_TASK, task)
        done = controls.tasks_control(tasks=[task], action=self.action, by=request.user)
        if done.refused:
            return errors_response({"state": [done.refused[0][1]]}, code=409)
        reloaded = selectors.task_detail(tenant=request_tenant(request).tenant, pk=task.pk)
        return Response(TaskDetail(reloaded).data)


# --- Inventory -----------------------------------------------------------------------------------


class NodeOut(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name")
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "name",
            "pool",
            "hostname",
            "backend",
            "state",
            "state_reason",
            "last_heartbeat",
            "gpu_count",
        ]


class MyTaskOnGpu(serializers.Serializer):
    id = serializers.IntegerField(source="task.id")
    name = serializers.CharField(source="task.name")
    memory_mb = serializers.IntegerField()


class GpuOut(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    reserved_mb = serializers.SerializerMethodField(help_text="Reserved by all tenants' tasks.")
    free_mb = serializers.SerializerMethodField(
        help_text="What a new task could still reserve: 0 while a task holds the GPU whole; "
        "never counts memory used by processes the platform did not start."
    )
    in_use = serializers.SerializerMethodField()
    my_tasks = serializers.SerializerMethodField(help_text="Your tenant's tasks on this GPU.")

    class Meta:
        model = GPU
        fields = [
            "id",
            "uuid",
            "node",
            "index",
            "model",
            "gpu_type",
            "memory_mb",
            "pci_bus_id",
            "state",
            "state_reason",
            "foreign_memory_mb",
            "reserved_mb",
            "free_mb",
            "in_use",
            "my_tasks",
            "last_seen_at",
        ]

    def get_reserved_mb(self, gpu: GPU) -> int:
        return sum(a.memory_mb for a in gpu.active_allocations)

    def get_free_mb(self, gpu: GPU) -> int:
        return free_memory_mb(
            memory_mb=gpu.memory_mb,
            reserved_mb=self.get_reserved_mb(gpu),
            foreign_mb=gpu.foreign_memory_mb,
            exclusive=any(a.exclusive for a in gpu.active_allocations),
        )

    def get_in_use(self, gpu: GPU) -> bool:
        return bool(gpu.active_allocations)

    def get_my_tasks(self, gpu: GPU) -> list[dict]:
        return MyTaskOnGpu(gpu.tenant_allocations, many=True).data


class PoolOut(serializers.ModelSerializer):
    node_count = serializers.IntegerField(read_only=True)
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Pool
        fields = ["name", "description", "node_count", "gpu_count"]


class NodeList(generics.ListAPIView):
    """Nodes of the cluster with their state and GPU count."""

    permission_classes = [IsTenantMember]
    serializer_class = NodeOut

    def get_queryset(self):
        return selectors.node_list()


class GpuList(generics.ListAPIView):
    """GPUs with their state, type and memory, and which of your tasks use them."""

    permission_classes = [IsTenantMember]
    serializer_class = GpuOut

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return GPU.objects.none()
        return selectors.gpu_list(tenant=request_tenant(self.request).tenant)


class PoolList(generics.ListAPIView):
    """Pools and how many nodes and GPUs each has."""

    permission_classes = [IsTenantMember]
    serializer_class = PoolOut

    def get_queryset(self):
        return selectors.pool_list()


# --- Operators ---------------------------------------------------------------------------------


class OperatorTaskOut(TaskOut):
    tenant = serializers.CharField(source="tenant.name")

    class Meta(TaskOut.Meta):
        fields = ["id", "tenant", *TaskOut.Meta.fields[1:]]


class OperatorTaskQuery(serializers.Serializer):
    tenant = serializers.CharField(
        source="tenant_name", required=False, allow_blank=True, help_text="the tenant's name"
    )
    state = StatesField(source="states")


class OperatorTaskList(generics.ListAPIView):
    """Every tenant's tasks (operators only)."""

    permission_classes = [IsOperator]
    serializer_class = OperatorTaskOut
    pagination_class = TaskPage

    @extend_schema(parameters=[OperatorTaskQuery])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Task.objects.none()
        return selectors.task_list_all(**query.parse(OperatorTaskQuery, self.request.query_params))


DrainOut = inline_serializer("DrainResult", {"changed": serializers.IntegerField()})


class GpuDrain(APIView):
    """Drain (no new work) or undrain (back to service, also for a failed GPU) one GPU."""

    permission_classes = [IsOperator]
    action = ""

    @extend_schema(request=None, responses=DrainOut)
    def post(self, request: Request, pk: int) -> Response:
        gpu = get_object_or_404(GPU, pk=pk)
        act = services.gpus_drain if self.action == "drain" else services.gpus_undrain
        return Response({"changed": act(gpus=[gpu], actor=request.user)})


class NodeDrain(APIView):
    """Drain or undrain a node."""

    permission_classes = [IsOperator]
    action = ""

    @extend_schema(request=None, responses=DrainOut)
    def post(self, request: Request, name: str) -> Response:
        node = get_object_or_404(Node, name=name)
        act = services.nodes_drain if self.action == "drain" else services.nodes_undrain
        return Response({"changed": act(nodes=[node], actor=request.user)})
