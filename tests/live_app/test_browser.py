"""The dashboard in headless Chromium against real daphne and the PostgreSQL channel layer;
changes come from other processes, as the node agent's and the scheduler's do. Each test saves
a screenshot under var/screenshots/."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.browser import screenshot
from tests.factories import NodeFactory, TaskFactory, make_gpus
from tests.live import free_port, shell, web_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rack(lab, outsider):
    """Two nodes of four GPUs; the lab runs a task on the first GPU of the first node."""
    from tests.factories import AllocationFactory

    nodes = [NodeFactory(name=f"gpu-node-{i}") for i in (1, 2)]
    gpus = [make_gpus(node, count=4) for node in nodes]
    task = TaskFactory(
        tenant=lab,
        name="resnet-50",
        state="running",
        node=nodes[0],
        started_at=timezone.now() - timedelta(seconds=3700),
    )
    AllocationFactory(task=task, gpu=gpus[0][0], exclusive=True, memory_mb=gpus[0][0].memory_mb)
    TaskFactory(tenant=outsider.tenant, name="bert-large", reason="waiting for 8 GPUs")
    return {"nodes": nodes, "gpus": gpus, "task": task}


def open_dashboard(browser_page, browser_server, user, locale: str = "en-GB"):
    page = browser_page(user, locale=locale)
    page.goto(f"{browser_server}/dashboard/")
    page.wait_for_function("window.gpDashboard && window.gpDashboard.connected()")
    page.evaluate("window.loadedOnce = true")  # gone if the page reloads
    return page


def publish_ticks(node, gpus, ticks: int, util_of) -> None:
    """``ticks`` seconds of samples of ``gpus`` published from another process."""
    now = time.time() - ticks
    samples = [
        {
            "gpu_uuid": gpu.uuid,
            "at": now + tick,
            "util_gpu": util_of(tick, index),
            "memory_used_mb": 4096 * (index + 1),
            "memory_total_mb": gpu.memory_mb,
            "temperature_c": 40 + 10 * index,
            "power_w": 100.0 + 50 * index,
        }
        for tick in range(ticks)
        for index, gpu in enumerate(gpus)
    ]
    shell(
        "import json, time\nfrom live.events import publish_samples\n"
        f"samples = json.loads({str(__import__('json').dumps(samples))!r})\n"
        "for at in sorted({s['at'] for s in samples}):\n"
        f"    publish_samples(node_id={node.pk}, samples=[s for s in samples if s['at'] == at])\n"
        "    time.sleep(0.1)  # a tenth of a sampler's pace: most ticks reach the page\n",
        CHANNEL_LAYER="postgres",
    )


def test_the_dashboard_loads(browser_page, browser_server, operator, rack):
    page = open_dashboard(browser_page, browser_server, operator)
    assert page.locator(".gp-tile").count() == 8
    assert "resnet-50" in page.locator(f"#gpu-{rack['gpus'][0][0].pk}").inner_text()
    assert "waiting for 8 GPUs" in page.locator("#gp-pending-table").inner_text()
    assert page.locator("#gp-status").get_attribute("data-state") == "live"
    runtime = page.locator(f'tr[data-task-id="{rack["task"].pk}"] .gp-runtime').inner_text()
    assert runtime.startswith("1 h 1 min")  # counted on by the page since its render
    screenshot(page, "dashboard")


def test_a_busy_gpu_says_in_use_not_available(browser_page, browser_server, operator, rack):
    page = open_dashboard(browser_page, browser_server, operator)
    busy, idle = rack["gpus"][0][0], rack["gpus"][0][1]
    assert page.locator(f"#gpu-{busy.pk} .gp-state").inner_text().lower() == "in use"
    assert page.locator(f"#gpu-{idle.pk} .gp-state").inner_text().lower() == "available"


def test_the_dashboard_speaks_chinese_with_its_own_language_switch(
    browser_page, browser_server, operator, rack
):
    page = open_dashboard(browser_page, browser_server, operator, locale="zh-CN")
    busy, idle = rack["gpus"][0][0], rack["gpus"][0][1]
    node = rack["nodes"][0]
    # Rendered by the server, said again by the script (Django's JavaScript catalogue).
    assert page.locator(f"#gpu-{busy.pk} .gp-state").inner_text() == "使用中"
    assert page.locator(f"#gpu-{idle.pk} .gp-state").inner_text() == "可用"
    assert page.locator(f"#node-{node.pk} .gp-node-state").inner_text() == "可用"
    assert page.locator("#gp-conn").inner_text() == "实时"
    assert page.locator(f"#gpu-{idle.pk} .gp-type").inner_text() == "rtx4090-24g · 模拟"
    assert "时间" in page.locator("#gp-chart-util").inner_text()  # the chart's legend
    shell(
        "from scheduling import services\nfrom scheduling.models import GPU\n"
        f"services.gpus_drain(gpus=[GPU.objects.get(pk={idle.pk})])",
        CHANNEL_LAYER="postgres",
    )
    page.wait_for_selector(f'#gpu-{idle.pk}[data-state="draining"]')
    assert page.locator(f"#gpu-{idle.pk} .gp-state").inner_text() == "排空中"
    screenshot(page, "dashboard-zh")
    # The switch turns the page to English, where it stays.
    page.select_option("#language-switch", "en")
    page.click(".language-form button[type=submit]")
    page.wait_for_function("window.gpDashboard && window.gpDashboard.connected()")
    assert page.locator("#gp-conn").inner_text() == "live"
    assert page.locator(f"#gpu-{busy.pk} .gp-state").inner_text().lower() == "in use"


def test_a_chart_receives_points_pushed_after_the_page_opened(
    browser_page, browser_server, operator, rack
):
    page = open_dashboard(browser_page, browser_server, operator)
    assert page.evaluate("gpDashboard.chartPoints('gp-chart-util')") == 0
    node, gpus = rack["nodes"][0], rack["gpus"][0]
    publish_ticks(node, gpus, 30, lambda tick, index: (tick * 7 + index * 25) % 100)
    # Published in a burst, the ticks are coalesced for the page (back-pressure): the first
    # and the newest always arrive, the ones between as the page's acknowledgements allow.
    tile = page.locator(f"#gpu-{gpus[3].pk}")
    last = f"{(29 * 7 + 75) % 100}%"
    page.wait_for_function(
        "([id, text]) => document.querySelector(`#gpu-${id} [data-metric=util]`).textContent"
        " === text",
        arg=[gpus[3].pk, last],
    )
    assert page.evaluate("gpDashboard.chartPoints('gp-chart-util')") >= 2
    assert tile.locator('[data-metric="power"]').inner_text() == "250 W"
    assert page.evaluate("window.loadedOnce") is True
    screenshot(page, "dashboard-live-charts")


def test_a_drained_gpu_changes_tile_state_without_a_reload(
    browser_page, browser_server, operator, rack
):
    page = open_dashboard(browser_page, browser_server, operator)
    gpu = rack["gpus"][1][2]
    tile = page.locator(f"#gpu-{gpu.pk}")
    assert tile.get_attribute("data-state") == "available"
    shell(
        "from scheduling import services\nfrom scheduling.models import GPU\n"
        f"services.gpus_drain(gpus=[GPU.objects.get(pk={gpu.pk})])",
        CHANNEL_LAYER="postgres",
    )
    page.wait_for_selector(f'#gpu-{gpu.pk}[data-state="draining"]')
    assert tile.locator(".gp-state").inner_text().lower() == "draining"
    assert tile.locator(".gp-undrain").is_visible() and not tile.locator(".gp-drain").is_visible()
    assert page.evaluate("window.loadedOnce") is True
    screenshot(page, "dashboard-drained-gpu")


def test_an_operator_drains_a_gpu_from_its_tile_after_confirming(
    browser_page, browser_server, operator, rack
):
    page = open_dashboard(browser_page, browser_server, operator)
    gpu = rack["gpus"][0][1]
    page.locator(f"#gpu-{gpu.pk} .gp-drain").click()
    page.wait_for_selector("#gp-confirm")
    assert "Drain GPU" in page.content()
    gpu.refresh_from_db()
    assert gpu.state == "available"  # nothing happens before the confirmation
    page.locator("#gp-confirm").click()
    page.wait_for_selector(f'#gpu-{gpu.pk}[data-state="draining"]')
    gpu.refresh_from_db()
    assert gpu.state == "draining"
    screenshot(page, "dashboard-drain-confirmed")


def test_the_time_range_picker_loads_history(browser_page, browser_server, operator, rack):
    from telemetry.models import GpuSample

    node, gpus = rack["nodes"][0], rack["gpus"][0]
    now = timezone.now()
    GpuSample.objects.bulk_create(
        [
            GpuSample(
                gpu=gpu,
                at=now - timedelta(seconds=10 * step),
                util_gpu=(step * 3 + index * 20) % 100,
                memory_used_mb=1024 * (index + 1),
                memory_total_mb=gpu.memory_mb,
                power_w=120.0,
            )
            for step in range(60)
            for index, gpu in enumerate(gpus)
        ]
    )
    page = open_dashboard(browser_page, browser_server, operator)
    # The live charts start with the last 15 minutes of history...
    page.wait_for_function(f"gpDashboard.liveTicks({node.pk}) === 60")
    # ...and the picker reads other ranges.
    page.select_option("#gp-chart-node", str(node.pk))
    page.select_option("#gp-range", "15m")
    page.wait_for_function("gpDashboard.historyPoints() > 0")
    assert page.evaluate("gpDashboard.historyPoints()") == 60
    assert page.evaluate("gpDashboard.chartPoints('gp-chart-util')") == 60
    assert "60 points" in page.locator("#gp-range-note").inner_text()
    screenshot(page, "dashboard-history")


def test_the_page_says_when_it_is_stale_and_fills_the_gap_after_reconnecting(
    browser_page, operator, rack, tmp_path
):
    from telemetry.models import GpuSample

    port, log = free_port(), tmp_path / "daphne.log"
    node, gpus = rack["nodes"][0], rack["gpus"][0]
    with web_server(log=log, port=port, CHANNEL_LAYER="postgres") as base:
        page = open_dashboard(browser_page, base, operator)
    # The server is gone: the page says its figures are stale.
    page.wait_for_selector('#gp-status[data-state="stale"]')
    assert "stale" in page.locator("#gp-conn").inner_text()
    screenshot(page, "dashboard-stale")
    # Samples taken while the page was cut off, as the node agent stores them.
    now = timezone.now()
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=now - timedelta(seconds=s), util_gpu=10 * s, power_w=100.0)
        for s in range(5)
        for gpu in gpus
    )
    with web_server(log=log, port=port, CHANNEL_LAYER="postgres"):
        page.wait_for_selector('#gp-status[data-state="live"]', timeout=60_000)
        page.wait_for_function(f"gpDashboard.liveTicks({node.pk}) >= 5")
        assert page.evaluate("window.loadedOnce") is True  # caught up, not reloaded
        tile = page.locator(f"#gpu-{gpus[0].pk}")
        assert tile.locator('[data-metric="util"]').inner_text() == "0%"  # the newest
        screenshot(page, "dashboard-caught-up")
