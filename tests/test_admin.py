"""Django admin for operators: every page renders with data, lists cost a fixed number of
queries, the actions change what they say, and the read-only parts stay read-only."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.models import Task as QTask
from django_q.signing import SignedPackage

from monitoring.services import alert_raise
from scheduling import services
from scheduling.models import (
    GPU,
    Allocation,
    GpuState,
    Node,
    NodeState,
    SchedulerState,
    Task,
    TaskEvent,
)
from tenants.models import ApiToken, Role
from tests.factories import (
    AllocationFactory,
    MembershipFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TaskEventFactory,
    TaskFactory,
    UserFactory,
    make_gpus,
    make_token,
)

REGISTERED = sorted(admin.site._registry, key=lambda model: model._meta.label)
OURS = [m for m in REGISTERED if m._meta.app_label in {"scheduling", "tenants"}]


def label(model) -> str:
    return model._meta.label


def url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def operator(db, client):
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return user


@pytest.fixture
def estate(owner, workstation):
    """A bit of everything: a node with GPUs, a running task holding one, tenants, a quota,
    tokens, and something in each of django-q2's tables."""
    gpu = workstation.gpus.get(index=0)
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, name="qwen-sft")
    services.task_transition(task=task, to_state="scheduled", node=workstation)
    AllocationFactory(task=task, gpu=gpu, memory_mb=gpu.memory_mb, exclusive=True)
    services.task_transition(task=task, to_state="running", actor=owner.user)
    QuotaFactory(tenant=owner.tenant)
    QuotaFactory(tenant=owner.tenant, pool=workstation.pool, max_priority=90)
    SchedulerState.objects.get_or_create(pk=1)  # transactional tests may have flushed it
    alert_raise(kind="gpu_memory_overuse", severity="warning", message="qwen-sft over",
                gpu=gpu, task=task)  # fmt: skip
    Group.objects.create(name="operators").user_set.add(owner.user)

    now = timezone.now()
    Schedule.objects.create(func="scheduling.tasks.mark_silent_nodes", schedule_type="I")
    for success in (True, False):
        QTask.objects.create(
            id=f"q-{success}",
            name=f"q-{success}",
            func="math.floor",
            started=now,
            stopped=now,
            success=success,
            result=None if success else "boom",
        )
    OrmQ.objects.create(
        key="gpuplatform",
        payload=SignedPackage.dumps({"id": "q-queued", "name": "queued", "func": "math.floor"}),
    )
    return task


def test_every_app_of_ours_is_in_the_admin():
    assert {label(m) for m in OURS} == {
        "scheduling.Pool",
        "scheduling.Node",
        "scheduling.GPU",
        "scheduling.Task",
        "scheduling.Allocation",
        "scheduling.TaskEvent",
        "scheduling.SchedulerState",
        "tenants.Tenant",
        "tenants.Membership",
        "tenants.Quota",
        "tenants.ApiToken",
    }


@pytest.mark.parametrize("model", REGISTERED, ids=label)
def test_every_changelist_and_change_page_renders_with_data(client, operator, estate, model):
    listing = client.get(url(model, "changelist"))

    assert listing.status_code == 200
    rows = listing.context["cl"].result_list
    assert len(rows) >= 1, f"no {label(model)} rows to show"

    page = client.get(url(model, "change", rows[0].pk))
    assert page.status_code == 200


def test_the_task_page_shows_its_allocation_and_events(client, operator, estate):
    page = client.get(url(Task, "change", estate.pk))

    inlines = {
        f.opts.model._meta.model_name: f.formset for f in page.context["inline_admin_formsets"]
    }
    [allocation] = [form.instance for form in inlines["allocation"]]
    assert str(allocation.gpu) == "workstation-1/gpu0"
    events = [(f.instance.from_state, f.instance.to_state) for f in inlines["taskevent"]]
    assert events == [("pending", "scheduled"), ("scheduled", "running")]
    assert "workstation-1/gpu0" in page.content.decode()


# --- Query counts ------------------------------------------------------------------------------

_n = count()


def _node() -> Node:
    node = NodeFactory(pool=PoolFactory(name=f"pool-{next(_n)}"))
    make_gpus(node, count=1)
    return node


def _task() -> Task:
    return TaskFactory(node=_node(), owner=UserFactory())


def _allocation() -> None:
    task = _task()
    AllocationFactory(task=task, gpu=task.node.gpus.get())


def _membership() -> None:
    MembershipFactory(role=Role.VIEWER)


def _token() -> None:
    membership = MembershipFactory()
    make_token(user=membership.user, tenant=membership.tenant)


# One more row of each model, with its own related rows, so an N+1 would show.
MAKE_ROW: dict[str, Callable[[], object]] = {
    "scheduling.Pool": lambda: PoolFactory(name=f"pool-{next(_n)}"),
    "scheduling.Node": _node,
    "scheduling.GPU": _node,
    "scheduling.Task": _task,
    "scheduling.Allocation": _allocation,
    "scheduling.TaskEvent": lambda: TaskEventFactory(task=_task(), actor=UserFactory()),
    "tenants.Tenant": lambda: MembershipFactory().tenant,
    "tenants.Membership": _membership,
    "tenants.Quota": lambda: QuotaFactory(pool=PoolFactory(name=f"pool-{next(_n)}")),
    "tenants.ApiToken": _token,
}


def queries_to_list(client, model) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url(model, "changelist"))
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize("model", [m for m in OURS if label(m) in MAKE_ROW], ids=label)
def test_a_changelist_costs_the_same_queries_for_1_and_20_rows(
    client, operator, model, django_assert_max_num_queries
):
    make_row = MAKE_ROW[label(model)]
    make_row()
    queries_to_list(client, model)  # warm the per-process caches (content types, ...)

    with django_assert_max_num_queries(12):
        one = queries_to_list(client, model)
    for _ in range(19):
        make_row()
    with django_assert_max_num_queries(12):
        twenty = queries_to_list(client, model)

    assert model._default_manager.count() >= 20
    assert twenty == one


# --- Actions -----------------------------------------------------------------------------------


def act(client, model, action: str, objects) -> None:
    response = client.post(
        url(model, "changelist"), {"action": action, "_selected_action": [o.pk for o in objects]}
    )
    assert response.status_code == 302, response.content.decode()[:2000]


def test_drain_and_undrain_gpus(client, operator, workstation):
    gpu0, gpu1, *_ = workstation.gpus.order_by("index")

    act(client, GPU, "drain", [gpu0, gpu1])

    drained = GPU.objects.get(pk=gpu0.pk)
    assert drained.state == GpuState.DRAINING
    assert "drained by root" in drained.state_reason
    assert GPU.objects.filter(node=workstation, state=GpuState.AVAILABLE).count() == 2

    act(client, GPU, "undrain", [gpu0])

    assert GPU.objects.get(pk=gpu0.pk).state == GpuState.AVAILABLE
    assert GPU.objects.get(pk=gpu1.pk).state == GpuState.DRAINING


def test_undrain_returns_a_failed_gpu_to_service(client, operator, workstation):
    gpu = workstation.gpus.get(index=3)
    GPU.objects.filter(pk=gpu.pk).update(state=GpuState.FAILED, state_reason="Xid 79")

    act(client, GPU, "undrain", [gpu])

    gpu.refresh_from_db()
    assert (gpu.state, gpu.state_reason) == (GpuState.AVAILABLE, "")


def test_drain_and_undrain_nodes(client, operator, workstation):
    act(client, Node, "drain", [workstation])

    workstation.refresh_from_db()
    assert workstation.state == NodeState.DRAINING
    assert "drained by root" in workstation.state_reason

    act(client, Node, "undrain", [workstation])

    workstation.refresh_from_db()
    assert (workstation.state, workstation.state_reason) == (NodeState.AVAILABLE, "")


def test_revoke_tokens(client, operator, owner, teammate):
    act(client, ApiToken, "revoke", ApiToken.objects.filter(user=owner.user))

    assert ApiToken.objects.get(user=owner.user).revoked_at is not None
    assert ApiToken.objects.get(user=teammate.user).revoked_at is None


# --- Who may do what ---------------------------------------------------------------------------


def test_a_user_who_is_not_staff_is_sent_to_log_in(client, owner):
    client.force_login(owner.user)
    for model in (GPU, Task, ApiToken):
        response = client.get(url(model, "changelist"))
        assert response.status_code == 302
        assert response.url.startswith(reverse("admin:login"))


def test_nobody_adds_a_token_in_the_admin(client, operator):
    assert client.get(url(ApiToken, "add")).status_code == 403
    listing = client.get(url(ApiToken, "changelist")).content.decode()
    assert url(ApiToken, "add") not in listing


def test_gpus_and_allocations_are_not_typed_in(client, operator):
    assert client.get(url(GPU, "add")).status_code == 403
    assert client.get(url(Allocation, "add")).status_code == 403


def test_the_audit_trail_is_read_only(client, operator, estate):
    event = TaskEvent.objects.filter(task=estate).first()

    page = client.get(url(TaskEvent, "change", event.pk))
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.post(url(TaskEvent, "change", event.pk), {"reason": "x"}).status_code == 403
    assert client.get(url(TaskEvent, "delete", event.pk)).status_code == 403
    assert client.post(url(TaskEvent, "delete", event.pk), {"post": "yes"}).status_code == 403
    assert client.get(url(TaskEvent, "add")).status_code == 403

    event.refresh_from_db()
    assert event.reason != "x"
    assert TaskEvent.objects.filter(pk=event.pk).exists()


def test_the_scheduler_state_shows_the_pass_time_rounded(client, operator):
    SchedulerState.objects.update_or_create(
        pk=1, defaults={"passes": 7, "last_pass_ms": 193.39962000003652}
    )

    for page in (url(SchedulerState, "changelist"), url(SchedulerState, "change", 1)):
        html = client.get(page).content.decode()
        assert "193.4 ms" in html, page
        assert "193.3996" not in html, page
