"""Django admin for operators: every page renders with data, lists cost a fixed number of
queries, the actions change what they say, and the read-only parts stay read-only."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import count

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ, Schedule
from django_q.models import Task as QTask
from django_q.signing import SignedPackage

from monitoring.services import alert_raise
from scheduling import transitions
from scheduling.models import (
    GPU,
    Allocation,
    GpuState,
    Node,
    NodeState,
    PassRequest,
    SchedulerState,
    Successor,
    Task,
    TaskEvent,
)
from telemetry.models import SimulatedFault, XidRecord
from tenants.models import ApiToken, Quota, Role, Tenant
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
    transitions.task_transition(task=task, to_state="scheduled", node=workstation)
    AllocationFactory(task=task, gpu=gpu, memory_mb=gpu.memory_mb, exclusive=True)
    transitions.task_transition(task=task, to_state="running", actor=owner.user)
    QuotaFactory(tenant=owner.tenant)
    QuotaFactory(tenant=owner.tenant, pool=workstation.pool, max_priority=90)
    SchedulerState.objects.get_or_create(pk=1)  # transactional tests may have flushed it
    waiting = TaskFactory(tenant=owner.tenant, owner=owner.user, name="next-up")
    Successor.objects.create(
        generation=1, task=waiting, rank=1, listed=1, gpus=1, gpu_ids=[gpu.pk], fenced=False
    )
    alert_raise(kind="gpu_memory_overuse", severity="warning", message="qwen-sft over",
                gpu=gpu, task=task)  # fmt: skip
    Group.objects.create(name="operators").user_set.add(owner.user)
    XidRecord.objects.create(gpu=gpu, xid=79, at=timezone.now(), task=task, action="drain")
    SimulatedFault.objects.create(gpu=gpu, kind="temperature", value=95)

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
        "scheduling.Successor",
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
    "scheduling.Successor": lambda: Successor.objects.create(
        generation=next(_n), task=_task(), rank=1, listed=1, gpus=1, gpu_ids=[1], fenced=False
    ),
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


def test_nodes_gpus_and_allocations_are_not_typed_in(client, operator):
    assert client.get(url(Node, "add")).status_code == 403
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


# --- Tasks are submitted, never typed in ---------------------------------------------------------

SPEC = "name: sft\ncommand: python train.py\nresources:\n  gpus: 1\n"


def submit(client, tenant, owner, spec: str = SPEC):
    return client.post(url(Task, "add"), {"tenant": tenant.pk, "owner": owner.pk, "spec": spec})


def test_the_add_page_is_the_submit_service_s_form(client, operator, owner):
    listing = client.get(url(Task, "changelist")).content.decode()
    assert "Submit a task for a tenant" in listing

    page = client.get(url(Task, "add"))

    assert page.status_code == 200
    assert set(page.context["form"].fields) == {"tenant", "owner", "spec"}


def test_an_operator_submits_for_a_tenant_through_the_service(client, operator, owner, workstation):
    response = submit(client, owner.tenant, owner.user)

    task = Task.objects.get()
    assert response.status_code == 302
    assert response.url == url(Task, "change", task.pk)
    assert (task.tenant, task.owner, task.name, task.gpus_min) == (
        owner.tenant,
        owner.user,
        "sft",
        1,
    )
    assert task.spec["command"] == "python train.py"
    [event] = task.events.all()
    assert (event.to_state, event.actor) == ("pending", operator)
    assert event.reason == "submitted by root for alice"


def test_a_sweep_submitted_in_the_admin_lands_on_the_tenant_s_list(
    client, operator, owner, workstation
):
    sweep = "kind: sweep\nname: lr\nparameters:\n  lr: [1, 2, 3]\ntemplate:\n  command: echo {lr}\n"
    response = submit(client, owner.tenant, owner.user, sweep)

    assert response.status_code == 302
    assert response.url.endswith(f"?tenant__id__exact={owner.tenant.pk}")
    assert Task.objects.filter(tenant=owner.tenant).count() == 3


def api_errors(owner, spec: str) -> dict:
    """What the API answers the tenant's own member for the same spec."""
    response = Client().post(
        "/api/v1/tasks/", spec, content_type="application/yaml",
        HTTP_AUTHORIZATION=f"Bearer {owner.token}",
    )  # fmt: skip
    assert response.status_code == 400, response.content
    return response.json()["errors"]


@pytest.mark.parametrize(
    "spec, path",
    [
        ("name: [", "yaml"),  # the parser's
        ("name: x\ncommand: c\nresources:\n  gpus: 100\n", "resources.gpus"),  # feasibility
        ("name: x\ncommand: c\npriority: 90\n", "priority"),  # the quota's max_priority
        ("name: x\ncommand: c\nworkdir: ../../etc\n", "workdir"),
    ],
)
def test_the_submit_form_shows_the_service_s_refusal_in_the_api_s_words(
    client, operator, owner, workstation, spec, path
):
    QuotaFactory(tenant=owner.tenant, max_priority=60)

    response = submit(client, owner.tenant, owner.user, spec)

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert set(errors) == {"spec"}
    assert errors["spec"] == [f"{path}: {reason}" for reason in api_errors(owner, spec)[path]]
    assert not Task.objects.exists()


def test_the_submit_form_refuses_an_inactive_tenant_as_the_service_does(
    client, operator, owner, workstation
):
    Tenant.objects.filter(pk=owner.tenant.pk).update(is_active=False)

    response = submit(client, owner.tenant, owner.user)

    assert response.context["form"].errors == {"tenant": ["tenant vision-lab is inactive"]}
    assert not Task.objects.exists()


def test_the_owner_must_be_a_member_who_may_submit(client, operator, owner, outsider, workstation):
    viewer = UserFactory(username="dave")
    MembershipFactory(user=viewer, tenant=owner.tenant, role=Role.VIEWER)

    for user, words in ((outsider.user, "charlie is not a member"),
                        (viewer, "dave is a viewer there")):  # fmt: skip
        response = submit(client, owner.tenant, user)
        [error] = response.context["form"].errors["owner"]
        assert error.startswith(f"{words}: only an admin or member of vision-lab")
    assert not Task.objects.exists()


# --- History is read-only ----------------------------------------------------------------------


def finished(task: Task) -> Task:
    transitions.task_transition(task=task, to_state="succeeded", reason="exited with 0")
    return Task.objects.get(pk=task.pk)


def test_a_finished_task_s_page_has_no_editable_field(client, operator, estate):
    task = finished(estate)

    page = client.get(url(Task, "change", task.pk))

    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_save"' not in html
    assert not page.context["adminform"].form.fields
    for inline in page.context["inline_admin_formsets"]:
        assert not (inline.has_add_permission or inline.has_change_permission)
        assert not inline.has_delete_permission
    assert "<textarea" not in html and "<select" not in html
    fields = re.findall(r"<input[^>]* name=[^>]*>", html)  # the sidebar's filter has no name
    assert fields and [tag for tag in fields if 'type="hidden"' not in tag] == []
    for name in ("gpus_min", "command", "env", "priority"):
        assert f'name="{name}"' not in html
    assert "python train.py" in html  # shown, read-only


def test_a_post_cannot_rewrite_a_finished_task(client, operator, estate):
    task = finished(estate)
    change = {"gpus_min": 100, "gpus_max": 100, "command": "rm -rf /", "env": '{"A": "1"}',
              "priority": 100, "state": "pending"}  # fmt: skip

    assert client.post(url(Task, "change", task.pk), change).status_code == 403
    assert client.post(url(Task, "delete", task.pk), {"post": "yes"}).status_code == 403
    allocation = Allocation.objects.get(task=task)
    assert (
        client.post(url(Allocation, "change", allocation.pk), {"memory_mb": 1}).status_code == 403
    )
    assert client.post(url(Allocation, "delete", allocation.pk), {"post": "yes"}).status_code == 403

    task.refresh_from_db()
    assert (task.gpus_min, task.command, task.env, task.state) == (1, "python train.py", {},
                                                                    "succeeded")  # fmt: skip
    assert Allocation.objects.filter(pk=allocation.pk, memory_mb=allocation.memory_mb).exists()


def test_a_gpu_s_or_node_s_state_is_not_typed_in(client, operator, workstation):
    gpu = workstation.gpus.get(index=0)
    GPU.objects.filter(pk=gpu.pk).update(state=GpuState.FAILED, state_reason="Xid 79")

    client.post(url(GPU, "change", gpu.pk), {"state": "available", "state_reason": ""})
    client.post(url(Node, "change", workstation.pk),
                {"name": workstation.name, "pool": workstation.pool.pk, "state": "offline",
                 "gpus-TOTAL_FORMS": 0, "gpus-INITIAL_FORMS": 0})  # fmt: skip

    assert GPU.objects.get(pk=gpu.pk).state == GpuState.FAILED
    assert Node.objects.get(pk=workstation.pk).state == NodeState.AVAILABLE


def test_a_node_keeps_the_name_and_pool_its_agent_registered(client, operator, workstation):
    other = PoolFactory(name="inference")

    client.post(url(Node, "change", workstation.pk),
                {"name": "renamed", "pool": other.pk, "gpus-TOTAL_FORMS": 0,
                 "gpus-INITIAL_FORMS": 0})  # fmt: skip

    workstation.refresh_from_db()
    assert (workstation.name, workstation.pool.name) == ("workstation-1", "default")


# --- Task actions: the API's services ----------------------------------------------------------


def messages_after(client, model, action: str, objects, **extra) -> list[tuple[str, str]]:
    response = client.post(
        url(model, "changelist"),
        {"action": action, "_selected_action": [o.pk for o in objects], **extra},
        follow=True,
    )
    assert response.status_code == 200
    return [(m.level_tag, m.message) for m in response.context["messages"]]


def last_event(task: Task) -> TaskEvent:
    return TaskEvent.objects.filter(task=task).order_by("-id").first()


def test_pause_resume_cancel_and_retry_go_through_the_services(client, operator, estate):
    steps = [("pause", "paused"), ("resume", "resumed"), ("cancel", "cancelled"),
             ("retry", "retried")]  # fmt: skip
    for action, done in steps:
        said = messages_after(client, Task, action, [estate])

        estate.refresh_from_db()
        event = last_event(estate)
        state = {"resumed": "running", "retried": "pending"}.get(done, done)
        assert (estate.state, event.to_state, event.actor) == (state, state, operator), said
        assert event.reason == f"{done} by root"
        assert said[0][0] == "success"


def test_an_illegal_action_is_a_message_naming_the_task_not_a_500(client, operator, estate, owner):
    done = finished(estate)
    waiting = TaskFactory(tenant=owner.tenant, name="waits")

    said = messages_after(client, Task, "cancel", [done, waiting])

    assert ("success", "Cancelled (or stopping): 1 task(s).") in said
    assert ("error", f"#{done.pk} qwen-sft: a task cannot go from succeeded to cancelled "
            "(allowed from succeeded: none)") in said  # fmt: skip
    waiting.refresh_from_db()
    assert (done.state, waiting.state) == ("succeeded", "cancelled")
    assert messages_after(client, Task, "resume", [waiting]) == [
        ("error", f"#{waiting.pk} waits: a task cannot go from cancelled to resumed (only a "
         "paused task can be) (allowed from cancelled: pending)")
    ]  # fmt: skip


def test_changing_priority_asks_for_it_then_goes_through_the_service(client, operator, owner):
    task = TaskFactory(tenant=owner.tenant, name="waits", priority=50)

    page = client.post(url(Task, "changelist"),
                       {"action": "change_priority", "_selected_action": [task.pk]})  # fmt: skip
    assert page.status_code == 200
    assert "waits" in page.content.decode()

    said = messages_after(client, Task, "change_priority", [task], apply="1", priority="high")

    task.refresh_from_db()
    assert task.priority == 90
    assert said == [("success", "Priority 90: 1 task(s).")]
    event = last_event(task)
    assert (event.from_state, event.to_state, event.reason, event.actor) == (
        "pending", "pending", "priority 50 -> 90 by root", operator)  # fmt: skip


def test_a_priority_change_keeps_the_quota_and_leaves_history_alone(client, operator, owner):
    QuotaFactory(tenant=owner.tenant, max_priority=60)
    waiting = TaskFactory(tenant=owner.tenant, name="waits", priority=50)
    done = TaskFactory(tenant=owner.tenant, name="done", state="succeeded", priority=50)

    said = messages_after(client, Task, "change_priority", [waiting, done], apply="1",
                          priority="70")  # fmt: skip

    assert said == [
        ("error", f"#{waiting.pk} waits: priority: priority 70 is above this tenant's highest "
         "allowed, 60"),
        ("error", f"#{done.pk} done: state: the task is succeeded: a task that ended keeps the "
         "priority it had"),
    ]  # fmt: skip
    assert set(Task.objects.values_list("priority", flat=True)) == {50}
    assert not TaskEvent.objects.exists()


def test_a_bad_priority_is_a_field_error_on_the_action_s_page(client, operator, owner):
    task = TaskFactory(tenant=owner.tenant, priority=50)

    page = client.post(url(Task, "changelist"), {"action": "change_priority", "apply": "1",
                       "_selected_action": [task.pk], "priority": "urgent"})  # fmt: skip

    assert page.status_code == 200
    assert page.context["form"].errors["priority"] == [
        "must be low, normal, high or a whole number 0-100, got 'urgent'"
    ]
    task.refresh_from_db()
    assert task.priority == 50


def test_a_drain_names_what_it_left_as_it_was(client, operator, workstation):
    gpu0, gpu1, *_ = workstation.gpus.order_by("index")
    GPU.objects.filter(pk=gpu1.pk).update(state=GpuState.FAILED, state_reason="Xid 79")

    said = messages_after(client, GPU, "drain", [gpu0, gpu1])

    assert said == [
        ("success", "Draining 1 GPU(s)."),
        ("warning", "workstation-1/gpu1 is failed, left as it was: only an available GPU can be "
         "drained."),
    ]  # fmt: skip


# --- Tenants and quotas: the model's rules, for the admin and the API alike ---------------------


QUOTA_FORM = {"max_priority": 100, "fair_share_weight": 1.0}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"max_priority": 101}, "max_priority"),
        ({"fair_share_weight": 0}, "fair_share_weight"),
        ({"fair_share_weight": -1}, "fair_share_weight"),
        ({}, "pool"),  # the tenant already has a cluster-wide quota
    ],
)
def test_a_quota_the_api_refuses_the_admin_refuses_in_the_same_words(
    client, operator, owner, change, field
):
    QuotaFactory(tenant=owner.tenant)

    page = client.post(url(Quota, "add"), {"tenant": owner.tenant.pk, **QUOTA_FORM, **change})
    api = client.post("/api/v1/operator/quotas/", {"tenant": "vision-lab", **change},
                      content_type="application/json")  # fmt: skip

    assert page.status_code == 200
    assert api.status_code == 400, api.content
    assert page.context["adminform"].form.errors[field] == api.json()["errors"][field]
    assert Quota.objects.count() == 1


def test_two_new_quota_rows_for_one_place_are_refused_on_the_tenant_page(client, operator, owner):
    form = {"name": "vision-lab", "is_active": "on", "memberships-TOTAL_FORMS": 0,
            "memberships-INITIAL_FORMS": 0, "quotas-TOTAL_FORMS": 2, "quotas-INITIAL_FORMS": 0,
            "quotas-0-max_priority": 100, "quotas-0-fair_share_weight": 1, "quotas-0-max_gpus": 4,
            "quotas-1-max_priority": 90, "quotas-1-fair_share_weight": 1}  # fmt: skip

    page = client.post(url(Tenant, "change", owner.tenant.pk), form)

    assert page.status_code == 200
    [formset] = [f.formset for f in page.context["inline_admin_formsets"]
                 if f.formset.prefix == "quotas"]  # fmt: skip
    assert formset.forms[1].errors["pool"] == ["this tenant already has a quota here"]
    assert not Quota.objects.exists()


@pytest.mark.parametrize(
    "values, field",
    [
        ({"name": "vision-lab"}, "name"),
        ({"name": "Vision Lab"}, "name"),
        ({"name": "speech-lab", "unix_user": "root"}, "unix_user"),
        ({"name": "speech-lab", "unix_user": "bad user"}, "unix_user"),
    ],
)
def test_a_tenant_the_api_refuses_the_admin_refuses_in_the_same_words(
    client, operator, owner, values, field
):
    inlines = {f"{p}-{k}": 0 for p in ("memberships", "quotas")
               for k in ("TOTAL_FORMS", "INITIAL_FORMS")}  # fmt: skip

    page = client.post(url(Tenant, "add"), {"is_active": "on", **inlines, **values})
    api = client.post("/api/v1/operator/tenants/", values, content_type="application/json")

    assert page.status_code == 200
    assert api.status_code == 400, api.content
    assert page.context["adminform"].form.errors[field] == api.json()["errors"][field]
    assert list(Tenant.objects.values_list("name", flat=True)) == ["vision-lab"]


def test_the_scheduler_state_shows_the_pass_time_rounded(client, operator):
    SchedulerState.objects.update_or_create(
        pk=1, defaults={"passes": 7, "last_pass_ms": 193.39962000003652}
    )
    PassRequest.objects.update_or_create(pk=1, defaults={"queued": True})

    for page in (url(SchedulerState, "changelist"), url(SchedulerState, "change", 1)):
        html = client.get(page).content.decode()
        assert "193.4 ms" in html, page
        assert "193.3996" not in html, page
        assert 'alt="True"' in html, page  # a pass is queued (its own row: PassRequest)
