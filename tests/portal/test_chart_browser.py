"""The task page's GPU charts in headless Chromium against real daphne and the PostgreSQL
channel layer: a sample published by another process after the page opened reaches the chart."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.browser import screenshot
from tests.factories import AllocationFactory, TaskFactory
from tests.live import shell

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_task_chart_receives_a_point_pushed_after_the_page_opened(
    browser_page, browser_server, owner, workstation
):
    gpu = workstation.gpus.get(index=0)
    started = timezone.now() - timedelta(minutes=5)
    task = TaskFactory(
        tenant=owner.tenant, owner=owner.user, state="running", node=workstation, started_at=started
    )
    AllocationFactory(task=task, gpu=gpu, started_at=task.started_at)
    page = browser_page(owner.user)
    page.goto(f"{browser_server}/portal/tasks/{task.pk}/")
    page.wait_for_function("window.gpTaskCharts && window.gpTaskCharts.connected")
    assert page.evaluate("gpTaskCharts.chartPoints('gpu-chart-util')") == 0
    assert "simulated" in page.locator("#gpu-charts").inner_text()
    at = time.time()
    shell(
        "from live.events import publish_samples\n"
        f"publish_samples(node_id={workstation.pk}, samples=[{{'gpu_uuid': {gpu.uuid!r},"
        f" 'at': {at}, 'util_gpu': 87, 'memory_used_mb': 4096, 'memory_total_mb': 24576,"
        " 'temperature_c': 60, 'power_w': 300.0}])\n",
        CHANNEL_LAYER="postgres",
    )
    page.wait_for_function("gpTaskCharts.chartPoints('gpu-chart-util') === 1")
    assert page.evaluate("gpTaskCharts.chartPoints('gpu-chart-mem')") == 1
    assert page.locator("#gpu-charts-empty").count() == 0
    screenshot(page, "task-charts-en")
