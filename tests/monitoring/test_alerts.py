"""Alerts: one open alert per subject, raised idempotently, closed by what is no longer seen."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from gpuplatform import events
from monitoring import services
from monitoring.models import Alert, AlertKind, Severity
from tests.factories import NodeFactory, TaskFactory, make_gpus

OVERUSE = AlertKind.GPU_MEMORY_OVERUSE


@pytest.fixture
def gpus(workstation):
    return list(workstation.gpus.order_by("index"))


def overuse(gpu, task, message: str = "using 9000 MiB of 4000 reserved") -> Alert:
    return services.alert_raise(
        kind=OVERUSE, severity=Severity.WARNING, message=message, gpu=gpu, task=task
    )


def test_only_a_change_of_an_open_alert_reaches_the_live_dashboard(gpus, monkeypatch) -> None:
    """The sampler raises a hot GPU's alert every second: the dashboard hears of it when it
    opens, changes and closes, not at every refresh."""
    sent = []
    monkeypatch.setitem(events._subscribers, events.ALERTS, [sent.extend])
    task = TaskFactory()
    overuse(gpus[0], task, "using 5000 MiB")
    overuse(gpus[0], task, "using 5000 MiB")
    overuse(gpus[0], task, "using 9000 MiB")
    overuse(gpus[1], task, "using 5000 MiB")
    services.alerts_resolve_except(kind=OVERUSE, keep=set())

    assert [(a.gpu_id, a.message, a.is_open) for a in sent] == [
        (gpus[0].pk, "using 5000 MiB", True),
        (gpus[0].pk, "using 9000 MiB", True),
        (gpus[1].pk, "using 5000 MiB", True),
        (gpus[0].pk, "using 9000 MiB", False),
        (gpus[1].pk, "using 5000 MiB", False),
    ]


def test_raising_opens_an_alert_filed_under_the_gpus_node(gpus) -> None:
    task = TaskFactory()

    alert = overuse(gpus[0], task)

    assert alert.is_open
    assert (alert.kind, alert.severity) == ("gpu_memory_overuse", "warning")
    assert (alert.gpu, alert.task, alert.node) == (gpus[0], task, gpus[0].node)
    assert alert.opened_at == alert.last_seen_at


def test_raising_again_refreshes_the_open_alert_instead_of_opening_another(gpus) -> None:
    task = TaskFactory()
    first = overuse(gpus[0], task, "using 5000 MiB")

    again = services.alert_raise(
        kind=OVERUSE,
        severity=Severity.CRITICAL,
        message="using 9000 MiB",
        gpu=gpus[0],
        task=task,
    )

    assert again.pk == first.pk
    assert Alert.objects.count() == 1
    stored = Alert.objects.get()
    assert (stored.message, stored.severity) == ("using 9000 MiB", "critical")
    assert stored.opened_at == first.opened_at
    assert stored.last_seen_at > first.last_seen_at


def test_other_subjects_get_their_own_alerts(gpus) -> None:
    task, other_task = TaskFactory(), TaskFactory()

    overuse(gpus[0], task)
    overuse(gpus[1], task)
    overuse(gpus[0], other_task)
    services.alert_raise(kind=AlertKind.GPU_FAILED, severity="critical", message="x", gpu=gpus[0])
    services.alert_raise(kind=AlertKind.TASK_LOST, severity="warning", message="x", task=task)

    assert Alert.objects.filter(resolved_at=None).count() == 5


def test_node_alerts_without_gpu_or_task_are_one_per_node(gpus) -> None:
    other = NodeFactory()
    for node in (gpus[0].node, other, other):
        services.alert_raise(
            kind=AlertKind.NODE_OFFLINE, severity="critical", message="silent", node=node
        )

    assert Alert.objects.count() == 2


def test_a_gpu_alert_names_the_gpus_own_node(gpus) -> None:
    with pytest.raises(ValueError, match="is not on node"):
        services.alert_raise(
            kind=AlertKind.GPU_FAILED,
            severity="critical",
            message="x",
            gpu=gpus[0],
            node=NodeFactory(),
        )


def test_resolving_closes_only_that_subjects_alert(gpus) -> None:
    task = TaskFactory()
    overuse(gpus[0], task)
    kept = overuse(gpus[1], task)

    assert services.alert_resolve(kind=OVERUSE, gpu=gpus[0], task=task) == 1
    assert services.alert_resolve(kind=OVERUSE, gpu=gpus[0], task=task) == 0
    assert services.alert_resolve(kind=AlertKind.GPU_FAILED, gpu=gpus[1]) == 0

    assert list(Alert.objects.filter(resolved_at=None)) == [kept]


def test_raising_after_resolving_opens_a_new_alert_and_keeps_the_old_one(gpus) -> None:
    task = TaskFactory()
    old = overuse(gpus[0], task)
    services.alert_resolve(kind=OVERUSE, gpu=gpus[0], task=task)

    new = overuse(gpus[0], task)

    assert new.pk != old.pk
    old.refresh_from_db()
    assert old.resolved_at is not None
    assert new.is_open


def test_resolve_except_closes_what_is_no_longer_observed(gpus) -> None:
    t1, t2 = TaskFactory(), TaskFactory()
    overuse(gpus[0], t1)
    overuse(gpus[1], t1)
    overuse(gpus[0], t2)
    failed = services.alert_raise(
        kind=AlertKind.GPU_FAILED, severity="critical", message="x", gpu=gpus[2]
    )

    closed = services.alerts_resolve_except(
        kind=OVERUSE, keep={(gpus[1].pk, t1.pk)}, node=gpus[0].node
    )

    assert closed == 2
    still_open = Alert.objects.filter(resolved_at=None)
    assert {(a.kind, a.gpu_id, a.task_id) for a in still_open} == {
        (OVERUSE, gpus[1].pk, t1.pk),
        (AlertKind.GPU_FAILED, failed.gpu_id, None),
    }
    # Nothing left to close: a second call changes nothing.
    assert services.alerts_resolve_except(kind=OVERUSE, keep={(gpus[1].pk, t1.pk)}) == 0


def test_resolving_several_kinds_at_once_keeps_what_each_kind_still_sees(gpus) -> None:
    hot = [
        services.alert_raise(
            kind=AlertKind.GPU_OVER_TEMPERATURE, severity="warning", message="hot", gpu=gpu
        )
        for gpu in gpus[:2]
    ]
    ecc = services.alert_raise(
        kind=AlertKind.GPU_ECC, severity="critical", message="e", gpu=gpus[0]
    )
    keep = {AlertKind.GPU_OVER_TEMPERATURE: {(gpus[1].pk, None)}, AlertKind.GPU_ECC: set()}

    assert services.alerts_resolve_except_each(keep=keep, node=gpus[0].node) == 2

    open_now = set(Alert.objects.filter(resolved_at=None).values_list("pk", flat=True))
    assert open_now == {hot[1].pk}, (open_now, hot, ecc)
    # Nothing stale: one query answers for both kinds.
    with CaptureQueriesContext(connection) as queries:
        assert services.alerts_resolve_except_each(keep=keep, node=gpus[0].node) == 0
    assert len(queries) == 1


def test_resolve_except_for_one_node_leaves_other_nodes_alone(gpus) -> None:
    elsewhere = make_gpus(NodeFactory(name="workstation-2"), count=1)[0]
    task = TaskFactory()
    here = overuse(gpus[0], task)
    there = overuse(elsewhere, task)

    assert services.alerts_resolve_except(kind=OVERUSE, keep=set(), node=gpus[0].node) == 1

    here.refresh_from_db()
    there.refresh_from_db()
    assert not here.is_open
    assert there.is_open
    # Without a node, every node's alerts of that kind are considered.
    assert services.alerts_resolve_except(kind=OVERUSE, keep=set()) == 1


def test_the_database_holds_one_open_alert_per_subject(gpus) -> None:
    task = TaskFactory()
    now = timezone.now()

    def insert(**subject) -> None:
        Alert.objects.create(
            kind=OVERUSE, severity="warning", message="m", opened_at=now, **subject
        )

    insert(gpu=gpus[0], task=task, node=gpus[0].node)
    with pytest.raises(IntegrityError), transaction.atomic():
        insert(gpu=gpus[0], task=task, node=gpus[0].node)
    # NULLs are not distinct: "no GPU, no task, no node" is one subject too.
    insert()
    with pytest.raises(IntegrityError), transaction.atomic():
        insert()
    # A resolved alert does not count.
    Alert.objects.filter(gpu=None).update(resolved_at=now)
    insert()
    assert Alert.objects.count() == 3


def test_the_database_rejects_unknown_severities_and_resolving_before_opening(gpus) -> None:
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(kind=OVERUSE, severity="dire", message="m")
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(
            kind=OVERUSE,
            severity="info",
            message="m",
            opened_at=now,
            resolved_at=now - timedelta(seconds=1),
        )


def test_deleting_a_node_resolves_its_alerts_and_keeps_them(db) -> None:
    node = NodeFactory(name="retired")
    a, b = make_gpus(node, count=2)
    for gpu in (a, b):
        services.alert_raise(
            kind=AlertKind.GPU_FAILED, severity="critical", message="xid 79", gpu=gpu
        )
    earlier = overuse(a, TaskFactory())
    services.alert_resolve(kind=OVERUSE, gpu=a, task=earlier.task)
    earlier.refresh_from_db()

    # Two open alerts that differ only by the GPU would collide once both GPUs became NULL.
    node.delete()

    assert Alert.objects.count() == 3
    assert Alert.objects.filter(resolved_at=None).count() == 0
    assert set(Alert.objects.values_list("gpu", "node").distinct()) == {(None, None)}
    earlier_after = Alert.objects.get(pk=earlier.pk)
    # Already resolved: its resolution time stays what it was.
    assert earlier_after.resolved_at == earlier.resolved_at


# --- Admin -------------------------------------------------------------------------------------


@pytest.fixture
def operator(db, client):
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


def changelist() -> str:
    return reverse("admin:monitoring_alert_changelist")


def test_the_alert_list_shows_open_and_resolved_alerts(client, operator, gpus) -> None:
    task = TaskFactory(name="qwen-sft")
    overuse(gpus[0], task, "qwen-sft uses 9000 MiB of 4000 reserved")
    services.alert_raise(
        kind=AlertKind.GPU_FAILED, severity="critical", message="xid 79", gpu=gpus[1]
    )
    services.alert_resolve(kind=AlertKind.GPU_FAILED, gpu=gpus[1])

    page = client.get(changelist())

    assert page.status_code == 200
    assert len(page.context["cl"].result_list) == 2
    assert "qwen-sft uses 9000 MiB" in page.content.decode()

    opened = client.get(changelist(), {"status": "open"})
    assert [a.kind for a in opened.context["cl"].result_list] == [OVERUSE]
    resolved = client.get(changelist(), {"status": "resolved", "severity__exact": "critical"})
    assert [a.kind for a in resolved.context["cl"].result_list] == [AlertKind.GPU_FAILED]
    found = client.get(changelist(), {"q": "qwen"})
    assert len(found.context["cl"].result_list) == 1


def test_the_alert_page_is_read_only(client, operator, gpus) -> None:
    alert = overuse(gpus[0], TaskFactory())

    page = client.get(reverse("admin:monitoring_alert_change", args=[alert.pk]))

    assert page.status_code == 200
    assert not page.context["has_change_permission"]
    assert client.get(reverse("admin:monitoring_alert_add")).status_code == 403
    assert (
        client.post(
            reverse("admin:monitoring_alert_change", args=[alert.pk]), {"message": "edited"}
        ).status_code
        == 403
    )
    alert.refresh_from_db()
    assert alert.message != "edited"


def test_an_operator_resolves_alerts_from_the_list(client, operator, gpus) -> None:
    task = TaskFactory()
    chosen = overuse(gpus[0], task)
    other = overuse(gpus[1], task)

    response = client.post(
        changelist(), {"action": "resolve", "_selected_action": [chosen.pk]}, follow=True
    )

    assert response.status_code == 200
    assert "Resolved 1 alert(s)." in response.content.decode()
    chosen.refresh_from_db()
    other.refresh_from_db()
    assert not chosen.is_open
    assert other.is_open


def test_the_alert_list_costs_the_same_queries_for_1_and_20_rows(
    client, operator, django_assert_max_num_queries
) -> None:
    def make_row() -> None:
        node = NodeFactory()
        gpu = make_gpus(node, count=1)[0]
        overuse(gpu, TaskFactory(node=node))
        services.alert_raise(
            kind=AlertKind.NODE_OFFLINE, severity="critical", message="x", node=node
        )

    def queries_to_list() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(changelist()).status_code == 200
        return len(queries)

    make_row()
    queries_to_list()  # warm the per-process caches
    one = queries_to_list()
    for _ in range(19):
        make_row()

    assert queries_to_list() == one
    with django_assert_max_num_queries(12):
        queries_to_list()
