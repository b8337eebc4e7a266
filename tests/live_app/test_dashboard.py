"""The dashboard page, its actions and its history endpoint, through Django's test client."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from monitoring import services as alerts
from scheduling.models import Task
from tests.factories import NodeFactory, TaskFactory, TenantFactory, make_gpus

pytestmark = pytest.mark.django_db


def render_queries(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/dashboard/")
    assert response.status_code == 200
    return len(queries)


def test_anonymous_visitors_are_sent_to_the_login_page(client, settings):
    response = client.get("/dashboard/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_tenant_member_who_is_not_staff_is_sent_to_the_login_page(client, teammate):
    client.force_login(teammate.user)
    assert client.get("/dashboard/").status_code == 302


def test_the_dashboard_shows_gpus_holders_queue_alerts_and_links_to_the_admin(
    client, operator, estate
):
    TaskFactory(tenant=estate["ours"].tenant, name="waiting-one", reason="no free GPU")
    alerts.alert_raise(kind="gpu_failed", severity="critical", message="GPU fell off the bus")
    client.force_login(operator)
    page = client.get("/dashboard/").content.decode()
    gpu0, gpu1 = estate["gpus"]
    assert f'id="gpu-{gpu0.pk}"' in page and f'id="gpu-{gpu1.pk}"' in page
    assert f"/admin/scheduling/task/{estate['ours'].pk}/change/" in page
    assert "waiting-one" in page and "no free GPU" in page
    assert "GPU fell off the bus" in page
    assert "/static/vendor/uplot/uPlot.iife.min.js" in page
    assert 'href="/admin/"' in page  # back to the admin


def test_the_admin_links_to_the_dashboard(client, operator):
    client.force_login(operator)
    assert 'href="/dashboard/"' in client.get("/admin/").content.decode()


def test_the_query_count_does_not_grow_with_gpus_or_tasks(client, operator):
    client.force_login(operator)
    node = NodeFactory(name="n1")
    make_gpus(node, count=2)
    TaskFactory(name="p0")
    small = render_queries(client)
    for i in range(2, 6):
        make_gpus(NodeFactory(name=f"n{i}"), count=8)
    tenant = TenantFactory(name="busy-lab")
    Task.objects.bulk_create(
        [Task(tenant=tenant, name=f"t{i}", command="true", state="pending") for i in range(300)]
    )
    alerts.alert_raise(kind="node_offline", severity="warning", message="silent", node=node)
    assert render_queries(client) == small


@pytest.mark.parametrize(
    ("kind", "action", "before", "after"),
    [
        ("gpu", "drain", "available", "draining"),
        ("gpu", "undrain", "draining", "available"),
        ("node", "drain", "available", "draining"),
        ("node", "undrain", "draining", "available"),
    ],
)
def test_drain_and_undrain_ask_first_then_go_through_the_services(
    client, operator, workstation, kind, action, before, after
):
    obj = workstation.gpus.first() if kind == "gpu" else workstation
    type(obj).objects.filter(pk=obj.pk).update(state=before)
    client.force_login(operator)
    url = f"/dashboard/{kind}/{obj.pk}/{action}/"
    question = client.get(url)
    assert question.status_code == 200 and b"Are you sure?" in question.content
    obj.refresh_from_db()
    assert obj.state == before  # asking changed nothing
    response = client.post(url)
    assert (response.status_code, response["Location"]) == (302, "/dashboard/")
    obj.refresh_from_db()
    assert obj.state == after


def test_cancel_and_requeue_go_through_the_task_services(client, operator, lab):
    pending = TaskFactory(tenant=lab, name="p")
    ended = TaskFactory(tenant=lab, name="f", state="failed")
    client.force_login(operator)
    client.post(f"/dashboard/task/{pending.pk}/cancel/")
    client.post(f"/dashboard/task/{ended.pk}/requeue/")
    pending.refresh_from_db()
    ended.refresh_from_db()
    assert (pending.state, ended.state) == ("cancelled", "pending")
    assert pending.events.last().actor == operator


def test_an_action_that_cannot_be_done_says_why(client, operator, lab):
    pending = TaskFactory(tenant=lab, name="p")
    client.force_login(operator)
    response = client.post(f"/dashboard/task/{pending.pk}/requeue/", follow=True)
    assert "not done" in response.content.decode()
    pending.refresh_from_db()
    assert pending.state == "pending"


@pytest.mark.parametrize(
    "url",
    ["/dashboard/gpu/999999/drain/", "/dashboard/task/1/explode/", "/dashboard/volcano/1/drain/"],
)
def test_unknown_objects_and_actions_answer_404(client, operator, url):
    client.force_login(operator)
    assert client.get(url).status_code == 404


def test_actions_are_for_operators_only(client, teammate, workstation):
    client.force_login(teammate.user)
    gpu = workstation.gpus.first()
    assert client.post(f"/dashboard/gpu/{gpu.pk}/drain/").status_code == 302
    gpu.refresh_from_db()
    assert gpu.state == "available"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("range=1h", "node"),
        ("node=1&range=2w", "range"),
        ("node=1&start=abc&end=5", "start"),
        ("node=1&start=10&end=5", "end"),
        ("node=1&start=nan&end=5", "start"),
    ],
)
def test_history_rejects_bad_input_naming_the_field(client, operator, workstation, query, field):
    client.force_login(operator)
    query = query.replace("node=1", f"node={workstation.pk}")
    response = client.get(f"/dashboard/history/?{query}")
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_history_answers_a_series_for_a_range(client, operator, workstation):
    client.force_login(operator)
    response = client.get(f"/dashboard/history/?node={workstation.pk}&range=1h")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= {"t", "util", "mem", "power", "start", "end"}
    assert body["end"] - body["start"] == pytest.approx(3600)


def store_samples(gpu, *, ago_s: list[float], util: int, power: float = 100.0) -> None:
    from telemetry.models import GpuSample

    now = timezone.now()
    GpuSample.objects.bulk_create(
        [
            GpuSample(
                gpu=gpu,
                at=now - timedelta(seconds=ago),
                util_gpu=util,
                memory_used_mb=gpu.memory_mb // 2,
                memory_total_mb=gpu.memory_mb,
                temperature_c=60,
                power_w=power,
            )
            for ago in ago_s
        ]
    )


def test_history_serves_raw_samples_for_short_ranges(client, operator, workstation):
    gpu0, gpu1 = workstation.gpus.order_by("index")[:2]
    store_samples(gpu0, ago_s=[30, 20, 10], util=80, power=300.0)
    store_samples(gpu1, ago_s=[30, 20, 10], util=20, power=100.0)
    store_samples(gpu0, ago_s=[3600 * 3], util=5)  # outside the range
    client.force_login(operator)
    body = client.get(f"/dashboard/history/?node={workstation.pk}&range=15m").json()
    assert body["resolution"] == "raw"
    assert len(body["t"]) == 3
    assert body["util"][str(gpu0.pk)] == [80, 80, 80]
    assert body["util"][str(gpu1.pk)] == [20, 20, 20]
    assert body["mem"][str(gpu0.pk)] == [50.0, 50.0, 50.0]
    assert body["power"] == [400.0, 400.0, 400.0]


def test_history_serves_minute_rollups_for_longer_ranges(client, operator, workstation):
    from telemetry import jobs

    gpu0 = workstation.gpus.get(index=0)
    store_samples(gpu0, ago_s=[7200 + s for s in range(0, 120, 10)], util=40)
    now = timezone.now()
    jobs.rollup_minutes(start=now - timedelta(hours=3), end=now)
    client.force_login(operator)
    body = client.get(f"/dashboard/history/?node={workstation.pk}&range=6h").json()
    assert body["resolution"] == "minute"
    assert 2 <= len(body["t"]) <= 3  # two minutes of samples, maybe split over three buckets
    assert set(body["util"][str(gpu0.pk)]) == {40}


def test_a_tile_starts_with_the_gpus_latest_sample(client, operator, workstation):
    gpu0 = workstation.gpus.get(index=0)
    store_samples(gpu0, ago_s=[5], util=73)
    client.force_login(operator)
    page = client.get("/dashboard/").content.decode()
    tile = page[page.index(f'id="gpu-{gpu0.pk}"') :]
    assert '<span data-metric="util">73%</span>' in tile[:2000]
