"""The GPU estate (pools, nodes, GPUs) and the work placed on it (tasks, allocations, events).

Invariants the database can hold are declared here as constraints; the ones that span rows
(a GPU's reserved memory never exceeds its capacity, an exclusive allocation never shares its
GPU) are enforced by a trigger installed in migration 0002.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connection, models
from django.db.models import F, Q
from django.utils import timezone

from scheduling import reasons
from scheduling.policy.model import wait_record
from scheduling.states import TaskState
from tenants.models import SLUG_VALIDATOR


class Pool(models.Model):
    """A named group of nodes (for example "training" and "inference")."""

    name = models.CharField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeState(models.TextChoices):
    AVAILABLE = "available", "Available"
    DRAINING = "draining", "Draining"  # running work finishes, nothing new starts
    OFFLINE = "offline", "Offline"  # no heartbeat, or taken out by an operator


class Node(models.Model):
    """A GPU host running a node agent."""

    name = models.CharField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    hostname = models.CharField(max_length=255, blank=True)
    backend = models.CharField(max_length=16, blank=True, help_text="nvml or simulated")
    isolation = models.CharField(
        max_length=200,
        blank=True,
        help_text="How tenants are separated on this host: their own Unix users, or "
        "single-user mode (the agent is not root: tenants are not isolated on this host).",
    )
    process_tracking = models.CharField(
        max_length=200,
        blank=True,
        help_text="How an attempt's processes are tracked and killed: cgroups, or the "
        "supervisor's process tree.",
    )
    state = models.CharField(
        max_length=16, choices=NodeState.choices, default=NodeState.AVAILABLE, db_index=True
    )
    state_reason = models.CharField(max_length=500, blank=True)
    resume_state = models.CharField(
        max_length=16, blank=True, help_text="State to return to when an automatic offline ends."
    )
    advertise_address = models.CharField(
        max_length=255,
        blank=True,
        db_default="",
        help_text="host[:port] where the control plane reaches this node's agent "
        "(NODE_ADVERTISE_ADDRESS); blank: on the control plane's own host.",
    )
    registered_at = models.DateTimeField(default=timezone.now, editable=False)
    last_heartbeat = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in NodeState]), name="node_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class GpuState(models.TextChoices):
    AVAILABLE = "available", "Available"
    DRAINING = "draining", "Draining"
    OFFLINE = "offline", "Offline"  # vanished from discovery, or its node is offline
    FAILED = "failed", "Failed"  # NVML reported it lost or in error; an operator decides


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="NVML index on its node.")
    uuid = models.CharField(max_length=96, unique=True, verbose_name="UUID")
    model = models.CharField(max_length=128)
    gpu_type = models.CharField(max_length=64, db_index=True, verbose_name="GPU type")
    memory_mb = models.PositiveIntegerField(verbose_name="memory (MiB)")
    pci_bus_id = models.CharField(max_length=32, blank=True, verbose_name="PCI bus id")
    state = models.CharField(
        max_length=16, choices=GpuState.choices, default=GpuState.AVAILABLE, db_index=True
    )
    state_reason = models.CharField(max_length=500, blank=True)
    resume_state = models.CharField(
        max_length=16, blank=True, help_text="State to return to when an automatic offline ends."
    )
    foreign_memory_mb = models.PositiveIntegerField(
        default=0,
        verbose_name="foreign memory (MiB)",
        help_text="Memory held by processes the platform did not start; never offered to tasks.",
    )
    first_seen_at = models.DateTimeField(default=timezone.now, editable=False)
    last_seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["node__name", "index"]
        verbose_name = "GPU"
        verbose_name_plural = "GPUs"
        constraints = [
            models.CheckConstraint(condition=Q(memory_mb__gt=0), name="gpu_memory_positive"),
            models.CheckConstraint(
                condition=Q(foreign_memory_mb__lte=F("memory_mb")), name="gpu_foreign_le_memory"
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in GpuState]), name="gpu_state_valid"
            ),
            # A vanished GPU keeps its row (history, allocations) but gives up its index.
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=~Q(state=GpuState.OFFLINE),
                name="gpu_unique_index_per_node",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class TaskClass(models.TextChoices):
    BATCH = "batch", "Batch"  # preemptible by default
    ONLINE = "online", "Online"  # services: never preempted


TASK_STATE_CHOICES = [(s.value, s.value.replace("_", " ")) for s in TaskState]


# A foreign key that leads one of its model's composite indexes (a task's tenant, an event's or
# an attempt's task) has no index of its own (db_index=False): the composite one serves every
# lookup by it, and an index fewer is one entry fewer to write in every INSERT and in every
# update that changes an indexed column (a task's state, several times a task).
class Task(models.Model):
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="tasks", db_index=False
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="tasks",
    )
    name = models.CharField(max_length=200)
    queue = models.CharField(
        max_length=100, blank=True, help_text="Tasks in one queue of a tenant run one at a time."
    )
    priority = models.PositiveSmallIntegerField(default=50)
    task_class = models.CharField(
        max_length=16, choices=TaskClass.choices, default=TaskClass.BATCH, verbose_name="class"
    )
    preemptible = models.BooleanField(default=True)
    command = models.TextField()
    workdir = models.CharField(max_length=1024, blank=True)
    env = models.JSONField(default=dict, blank=True)
    spec = models.JSONField(default=dict, blank=True, help_text="The spec as submitted.")

    gpus_min = models.PositiveSmallIntegerField(default=1)
    gpus_max = models.PositiveSmallIntegerField(default=1)
    gpu_memory_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Per GPU, shares cards; empty = whole GPUs, exclusive."
    )
    gpu_type = models.CharField(max_length=64, blank=True)
    pool = models.ForeignKey(
        Pool, on_delete=models.PROTECT, null=True, blank=True, related_name="tasks"
    )
    required_node = models.CharField(max_length=63, blank=True)

    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    retries = models.PositiveSmallIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0, help_text="Starts so far.")
    infra_requeues = models.PositiveIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True, help_text="Retry backoff.")
    hold_reason = models.CharField(
        max_length=500, blank=True, help_text="Non-empty: kept out of scheduling until released."
    )
    depends_on = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="dependents"
    )
    # A service's replicas (the spec's service.replicas): each a task of its own, placed like
    # any other; the first is the service (its URL) and the others point to it.
    replica_of = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="replicas"
    )

    state = models.CharField(
        max_length=16,
        choices=TASK_STATE_CHOICES,
        default=TaskState.PENDING.value,
    )
    reason = models.TextField(blank=True, help_text="Why it waits, or how it ended (English).")
    reason_code = models.CharField(
        max_length=40,
        blank=True,
        help_text="The reason as data: its code in scheduling.reasons' catalogue (empty: the "
        "text only, as rows written before codes existed).",
    )
    reason_params = models.JSONField(
        default=dict, blank=True, help_text="The reason's parameters (scheduling.reasons)."
    )
    wait = models.JSONField(
        default=dict,
        blank=True,
        help_text="While pending, why it waits as data ({code, details}), as the last "
        "scheduling pass decided; the reason text is rendered from it, with the task's place in "
        "line (SchedulerState.line) when it has one. Empty otherwise.",
    )
    # A digest of (reason, wait) as the last pass wrote them (0: not written by a pass): the
    # pass compares it to what it decided and writes only the tasks whose reason changed.
    wait_digest = models.BigIntegerField(default=0, editable=False)
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks"
    )
    exit_code = models.IntegerField(null=True, blank=True)

    submitted_at = models.DateTimeField(default=timezone.now, editable=False)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "priority"], name="task_state_priority"),
            models.Index(fields=["tenant", "state"], name="task_tenant_state"),
            models.Index(fields=["tenant", "queue", "id"], name="task_tenant_queue"),
            # The portal's task list pages through a tenant's tasks by these orders (keyset).
            models.Index(fields=["tenant", "id"], name="task_tenant_id"),
            models.Index(fields=["tenant", "priority", "id"], name="task_tenant_priority_id"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__lte=100), name="task_priority_range"),
            models.CheckConstraint(
                condition=Q(gpus_max__gte=F("gpus_min")), name="task_gpus_range"
            ),
            models.CheckConstraint(
                condition=Q(gpu_memory_mb__isnull=True) | Q(gpu_memory_mb__gt=0),
                name="task_gpu_memory_positive",
            ),
            models.CheckConstraint(
                condition=Q(timeout_s__isnull=True) | Q(timeout_s__gt=0),
                name="task_timeout_positive",
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in TaskState]), name="task_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(task_class__in=[c.value for c in TaskClass]),
                name="task_class_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    # --- Why it waits, as read ---------------------------------------------------------------
    # A pass stores each pending task's reason and wait without its place in line, which moves
    # with every placement ahead of it; the line itself is one array (SchedulerState.line).
    # Reads join the two: ``attach_places`` for many tasks in one query, else one per task.

    @staticmethod
    def attach_places(tasks: Iterable[Task]) -> None:
        """Look up the place in line of every pending task of ``tasks`` in one query."""
        tasks = list(tasks)
        pending = [t.pk for t in tasks if t.state == TaskState.PENDING]
        places, starts = SchedulerState.places_and_starts(pending) if pending else ({}, {})
        for task in tasks:
            task._place = places.get(task.pk)
            task._start = starts.get(task.pk)

    @property
    def place(self) -> tuple[int, int] | None:
        """(position, how many wait in line) while it waits in line for GPUs or quota."""
        if self.state != TaskState.PENDING:
            return None
        if not hasattr(self, "_place"):
            self._place = SchedulerState.places([self.pk]).get(self.pk)
        return self._place

    @property
    def start_estimate(self) -> list | None:
        """While in line: [expected, earliest, latest, basis] (epoch seconds or None) as the
        last pass estimated it (``scheduling.forecasts``); None past the estimated few, or
        when not in line."""
        if self.state != TaskState.PENDING:
            return None
        if not hasattr(self, "_start"):
            places, starts = SchedulerState.places_and_starts([self.pk])
            self._place, self._start = places.get(self.pk), starts.get(self.pk)
        return self._start

    @property
    def expected_start(self) -> dict | None:
        """While pending and assessed by a pass: when it is expected to start, with bounds and
        a sentence (``forecasts.expected_start``); None otherwise."""
        if self.state != TaskState.PENDING or not self.wait:
            return None
        from scheduling import forecasts  # translation and formatting: not the model's own

        return forecasts.expected_start(self.start_estimate, self.place)

    @property
    def reason_text(self) -> str:
        """The reason as people read it, in the active language: while in line, with its place
        there."""
        text = self.reason_rendered
        if not self.wait:  # not assessed by a pass (yet): no place to look up
            return text
        place = self.place
        return text if place is None else reasons.in_line(text, *place)

    @property
    def reason_rendered(self) -> str:
        """The reason in the active language, without a place in line (no query)."""
        return reasons.render(self.reason_code, self.reason_params, self.reason)

    @property
    def wait_view(self) -> dict | None:
        """While pending and assessed by a pass: ``{code, position, line, details}``."""
        if self.state != TaskState.PENDING or not self.wait:
            return None
        position, line = self.place or (None, 0)
        return wait_record(self.wait.get("code", ""), self.wait.get("details", {}), position, line)


class StopRequest(models.TextChoices):
    NONE = "", "none"
    CANCEL = "cancel", "cancel"
    PREEMPT = "preempt", "preempt"
    VIOLATION = "violation", "violation"  # broke a limit (GPU memory): fails with the reason


class Health(models.TextChoices):
    NONE = "", "no health check"
    STARTING = "starting", "starting"  # within the start-up time, not yet answered
    HEALTHY = "healthy", "healthy"
    UNHEALTHY = "unhealthy", "unhealthy"


class TaskAttempt(models.Model):
    """One run of a task on its node: the supervisor, the process, and how it ended."""

    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    number = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="attempts")
    gpu_uuids = models.JSONField(default=list, blank=True)
    log_path = models.CharField(max_length=1024, blank=True)
    launched_by = models.CharField(
        max_length=63, blank=True, help_text="The django-q2 cluster that launched it."
    )
    supervisor_pid = models.PositiveIntegerField(null=True, blank=True)
    supervisor_started = models.FloatField(null=True, blank=True, help_text="Process start time.")
    pid = models.PositiveIntegerField(null=True, blank=True)
    pid_started = models.FloatField(null=True, blank=True, help_text="Process start time.")
    stop_requested = models.CharField(
        max_length=16, choices=StopRequest.choices, blank=True, default=StopRequest.NONE
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    # A service's attempt (the spec's service block): the port it was given on its node, and
    # what its health check last said.
    service_port = models.PositiveIntegerField(null=True, blank=True)
    # Database defaults: the agents insert attempts with SQL of their own.
    health = models.CharField(max_length=16, choices=Health.choices, blank=True, db_default="")
    health_checked_at = models.DateTimeField(null=True, blank=True)
    health_detail = models.CharField(max_length=500, blank=True, db_default="")
    # Why the platform ended it, as ``reasons.Reason.as_data``: its node's lease lapsed
    # ("node_fenced"). NULL where nothing more than the outcome is known.
    end_reason = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["task", "number"]
        constraints = [
            # A duplicate launch of the same attempt fails here: the launch is idempotent.
            models.UniqueConstraint(fields=["task", "number"], name="attempt_unique_number"),
            # A service's port is held by one attempt not ended on its node: two launches that
            # pick the same port cannot both record it.
            models.UniqueConstraint(
                fields=["node", "service_port"],
                condition=Q(outcome="", service_port__isnull=False),
                name="attempt_service_port_held",
            ),
        ]
        indexes = [
            # A node's attempts not ended (outcome ""): what its agent looks at every second
            # (lifecycle.watched_supervisors) and sweeps, however many it ran before. Not a
            # partial index: as a prepared statement's generic plan, "outcome = $1" does not
            # match "WHERE outcome = ''".
            models.Index(fields=["node", "outcome"], name="attempt_node_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.task} attempt {self.number}"

    @property
    def end_reason_text(self) -> str:
        """``end_reason`` in the active language ("" when none)."""
        if not self.end_reason:
            return ""
        return reasons.render(self.end_reason.get("code", ""), self.end_reason.get("params", {}))


class Allocation(models.Model):
    """GPUs (or a share of one) held by one attempt of a task."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="allocations")
    attempt = models.PositiveIntegerField()
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="allocations")
    memory_mb = models.PositiveIntegerField(help_text="Reserved on this GPU.")
    exclusive = models.BooleanField(default=True)
    started_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="alloc_active_gpu"
            ),
            # Fair share reads allocations released recently.
            models.Index(fields=["released_at"], name="alloc_released_at"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "gpu"],
                condition=Q(released_at__isnull=True),
                name="alloc_one_active_per_task_gpu",
            ),
            models.CheckConstraint(condition=Q(memory_mb__gt=0), name="alloc_memory_positive"),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | Q(released_at__gte=F("started_at")),
                name="alloc_released_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task} on {self.gpu} ({self.memory_mb} MiB)"


class TaskEvent(models.Model):
    """One transition of a task's state: the audit trail."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_index=False)
    at = models.DateTimeField(default=timezone.now)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    reason_code = models.CharField(max_length=40, blank=True)
    reason_params = models.JSONField(default=dict, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )

    class Meta:
        ordering = ["task", "at", "id"]
        indexes = [models.Index(fields=["task", "at"], name="taskevent_task_at")]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.from_state or '-'} -> {self.to_state}"

    @property
    def reason_text(self) -> str:
        """The reason in the active language (``scheduling.reasons``)."""
        return reasons.render(self.reason_code, self.reason_params, self.reason)


class SchedulerStateManager(models.Manager):
    def get_queryset(self):
        # The line holds one id per waiting task (10,000 and more): read only where asked for.
        return super().get_queryset().defer("line", "forecast")


class PassRequest(models.Model):
    """The one row that coalesces requests for a scheduling pass (``passes.request_pass``).

    A row of its own, not a column of ``SchedulerState``: the node agents' end reports claim
    it in the statement that frees GPUs, while holding their tasks' locks, and a pass writes
    ``SchedulerState`` while holding the locks of the tasks it places. On one row the two
    would wait for each other. Here, a statement that claims or clears the flag holds no other
    lock (a request; a pass, before its transaction: ``passes.mark_started``), or only locks
    that no one waiting for this row holds (an end report's running tasks, a submission's new
    rows)."""

    queued = models.BooleanField(
        default=False, help_text="A pass is queued and not yet started: no need to queue another."
    )
    started = models.BigIntegerField(
        default=0,
        help_text="Passes started so far (each clears the flag): a queued pass that never "
        "started, its scheduler gone, leaves it unchanged (passes.stalled).",
    )

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="passrequest_singleton")]

    def __str__(self) -> str:
        return "a pass is queued" if self.queued else "no pass queued"


class Successor(models.Model):
    """A waiting task a pass would start next, and the GPUs it may take
    (``policy.Decision.successors``): a node agent that records a task's plain end hands its
    GPUs to the first successor that fits them, in the same transaction (``handoff``), so a
    GPU does not wait for the next pass. Each pass writes a list of its own (a new
    ``generation``); agents take from the newest (``scheduler.list_successors``)."""

    generation = models.PositiveBigIntegerField(help_text="The list it belongs to.")
    # No foreign key in the database: each pass writes a list of about 200 rows and deletes the
    # last, and each row's key check locked its task's row (a write to the task's page, in the
    # log) for a row every hand-off reads through the task anyway (a task gone, or no longer
    # pending, is never placed from the list: ``handoff._CANDIDATES``). Django still deletes a
    # deleted task's rows (CASCADE); one deleted otherwise leaves a row until the next pass.
    task = models.ForeignKey(
        "Task", on_delete=models.CASCADE, related_name="+", db_constraint=False
    )
    rank = models.PositiveIntegerField(help_text="Its place in the list, from 1.")
    listed = models.PositiveIntegerField(help_text="How many the pass listed.")
    gpus = models.PositiveSmallIntegerField(help_text="GPUs it takes, on one node.")
    # 4-byte ids, so that a list on 256 GPUs stays under PostgreSQL's 2 kB threshold for moving
    # a value out of the row: as 8-byte ids each row's array was compressed with pglz, most of a
    # pass's time. Bigger estates' arrays are compressed with lz4 where the server has it
    # (migration 0018).
    gpu_ids = ArrayField(models.IntegerField(), help_text="The GPUs it may take.")
    fenced = models.BooleanField(
        help_text="Charged to its tenant's quota: a pass counts it as started while it is pending."
    )
    # A plain id, not a key: written by passes from the task's row, read by hand-offs only.
    swap_tenant = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Set (its tenant's id) when its tenant has no room in its quota: it takes "
        "only GPUs its tenant's ended tasks free.",
    )
    one_for_one = models.BooleanField(
        default=True,
        db_default=True,
        help_text="A swap whose tenant's quota counts running tasks: it replaces one ended task "
        "of its tenant, no more.",
    )
    memory_mb = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="What it reserves on each GPU it takes, sharing the card; 0: held whole.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["generation", "task"], name="successor_once_per_list")
        ]
        # A hand-off reads a tenant's swaps in rank order, the first few (``handoff``).
        indexes = [
            models.Index(fields=["generation", "swap_tenant", "rank"], name="successor_swaps")
        ]

    def __str__(self) -> str:
        return f"#{self.rank} of {self.listed} in list {self.generation}: task {self.task_id}"


# The places of some tasks (an array) in the line, as the rest of a SELECT. The line and the
# forecast are read once, in a subquery the planner keeps (OFFSET 0): read in the outer query,
# each of its rows decompressed them again (thousands of ids), which was most of a listing's
# query time while tasks wait.
_IN_LINE = """
  FROM (SELECT line, cardinality(line) AS length, forecast
          FROM scheduling_schedulerstate WHERE id = 1 OFFSET 0) AS s,
       unnest(s.line) WITH ORDINALITY AS u(id, position)
 WHERE u.id = ANY(%s)
"""


class SchedulerState(models.Model):
    """The one row that tells operators how scheduling passes go, and books time-based ones."""

    wake_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A pass is booked for this time (a retry backoff ends): no need to book a "
        "later one.",
    )
    passes = models.BigIntegerField(default=0)
    line = ArrayField(
        models.BigIntegerField(),
        default=list,
        blank=True,
        help_text="The tasks that wait for GPUs or quota, in the order they would start, as the "
        "last pass saw them: a task's place in line is its position here.",
    )
    # hash() of the line as a tuple (deterministic for integers): a pass that finds the same
    # line does not write 10,000 ids again.
    line_digest = models.BigIntegerField(default=0, editable=False)
    forecast = models.JSONField(
        default=dict,
        blank=True,
        help_text="When the first tasks in line are expected to start, as the last pass "
        "estimated it (scheduling.forecasts): task id -> [expected, earliest, latest, basis], "
        "epoch seconds or null.",
    )
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_ms = models.FloatField(null=True, blank=True)
    last_placed = models.PositiveIntegerField(default=0)
    last_preempted = models.PositiveIntegerField(default=0)
    last_waiting = models.PositiveIntegerField(default=0)
    last_idle_gpus = models.PositiveIntegerField(
        default=0,
        help_text="Schedulable GPUs no task held after the last pass placed what it could: at "
        "0, with tasks waiting, the next pass waits for scheduling.busy_pass_gap_ms.",
    )
    fair_share_half_life_s = models.FloatField(
        null=True,
        blank=True,
        help_text="The half-life the tenants' decayed usage counters are kept for.",
    )

    objects = SchedulerStateManager()

    class Meta:
        verbose_name = "scheduler state"
        verbose_name_plural = "scheduler state"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="schedulerstate_singleton")]

    def __str__(self) -> str:
        return f"scheduler: {self.passes} passes"

    @staticmethod
    def places(task_ids: list[int]) -> dict[int, tuple[int, int]]:
        """Task id -> (position, length of the line) for those of ``task_ids`` in line."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT u.id, u.position, s.length {_IN_LINE}", [task_ids])
            return {task_id: (position, total) for task_id, position, total in cursor}

    @staticmethod
    def places_and_starts(task_ids: list[int]) -> tuple[dict, dict]:
        """``places`` and the last pass's start estimates (``forecast``) of those of
        ``task_ids`` in line, in one query."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT u.id, u.position, s.length, s.forecast -> u.id::text {_IN_LINE}",
                [task_ids],
            )
            places, starts = {}, {}
            for task_id, position, total, start in cursor:
                places[task_id] = (position, total)
                if start is not None:
                    starts[task_id] = json.loads(start) if isinstance(start, str) else start
            return places, starts


class TenantUsage(models.Model):
    """A tenant's decayed GPU use from finished allocations on one node (see
    scheduling.fairshare), kept by a trigger on scheduling_allocation. One row per tenant and
    node, so that node agents committing ends never wait for each other's counter."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="usage")
    shard = models.BigIntegerField(
        help_text="The node whose GPUs these allocations held (its id; 0 for none)."
    )
    closed = models.FloatField(default=0.0, help_text="Decayed GPU use as of as_of.")
    as_of = models.DateTimeField()

    class Meta:
        verbose_name = "tenant usage"
        constraints = [
            models.UniqueConstraint(
                fields=("tenant", "shard"), name="scheduling_tenantusage_tenant_shard"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} on node {self.shard}: {self.closed:.3f} as of {self.as_of}"


class IdempotencyKey(models.Model):
    """A submission made with an ``Idempotency-Key`` header: a retry gets the first answer."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE)
    key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request body.")
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key}"


class NodeCredential(models.Model):
    """The PostgreSQL role a node's agent logs in as (``manage.py node_credential``). The
    row-level security policies of migration 0029 key on this row: that role sees and writes
    only its node's rows. By name, not by key: the node may register after its credential."""

    node_name = models.CharField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    role = models.CharField(max_length=63, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    rotated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.node_name} ({self.role})"
