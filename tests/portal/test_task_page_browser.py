"""One task page in headless Chromium, against a real daphne that really launches tasks, watched
through pending, running and finished without a reload: every section (state, node, GPUs,
attempts, timeline, runtime, GPU chart) follows the task as a reload would show it."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect, sync_playwright

from scheduling.models import Allocation, Task, TaskAttempt
from telemetry.models import GpuSample
from tests.nodeagent.launcher.conftest import launcher, node  # noqa: F401 - fixtures
from tests.portal.browser import chromium, screenshot
from tests.portal.test_browser import orm, people, sign_in, site  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
WAIT = 30_000  # ms: a launch on a busy machine may take a while; the test waits, never times


@pytest.fixture
def gates():
    """Files the tasks wait for, in a directory their tenant's user may look into: under
    /var/tmp, since a task's /tmp is a private tmpfs of its own."""
    folder = Path(tempfile.mkdtemp(prefix="gpuplatform-gates-", dir="/var/tmp"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def waits_for(gate: Path) -> str:
    return f"echo waiting; while [ ! -e {gate} ]; do sleep 0.1; done; echo done"


def submit(page, name: str, command: str) -> None:
    page.goto("/portal/submit/")
    page.fill("#id_task-name", name)
    page.fill("#id_task-command", command)
    page.fill("#id_task-gpus", "1")
    page.fill("#id_task-queue", "line")  # one at a time: the second waits for the first
    page.click("#task-form input[type=submit]")
    expect(page).to_have_url(f"/portal/tasks/{orm(lambda: Task.objects.get(name=name).pk)}/")


def fact(page, label: str):
    return page.locator("#facts-section tr", has=page.locator(f"th:text-is('{label}')")).locator(
        "td"
    )


def test_one_page_follows_its_task_from_pending_to_finished_without_a_reload(site, people, gates):  # noqa: F811
    first, second = gates / "first", gates / "second"
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        page = sign_in(browser, site, "alice")
        submit(page, "ahead", waits_for(first))
        submit(page, "watched", waits_for(second))
        watched = orm(lambda: Task.objects.get(name="watched"))
        page.evaluate("window.notReloaded = true")

        # Pending: behind "ahead" in its queue, on no node, holding no GPU.
        state = page.locator("#task-state")
        expect(state).to_contain_text("pending")
        expect(fact(page, "Node")).to_have_text("—")
        expect(page.locator("#gpus-section")).to_contain_text("It holds no GPU now.")
        expect(page.locator("#attempts-section")).to_contain_text("It has not started yet.")
        expect(page.locator("#gpu-history")).to_be_visible()
        screenshot(page, "task-live-1-pending-en")

        first.touch()  # "ahead" ends; the pass it wakes starts "watched"
        expect(state).to_contain_text("running", timeout=WAIT)
        expect(page.locator("#log-text")).to_contain_text("waiting", timeout=WAIT)
        attempt = orm(lambda: TaskAttempt.objects.get(task=watched, number=1))
        held = orm(lambda: Allocation.objects.select_related("gpu").get(task=watched).gpu)
        expect(fact(page, "Node")).to_have_text("workstation-1", timeout=WAIT)
        expect(page.locator("#gpus-section tbody")).to_contain_text(held.uuid)
        row = page.locator("#attempts-section tbody tr")
        expect(row).to_have_count(1)
        expect(row.locator("td").first).to_have_text("1")
        expect(row).to_contain_text(str(attempt.pid))
        timeline = page.locator("#timeline-section li")
        expect(timeline.filter(has_text="→ scheduled")).to_have_count(1)
        expect(timeline.filter(has_text="→ running")).to_have_count(1)
        expect(page.locator("#gpu-charts #gpu-chart-util .uplot")).to_have_count(1)
        expect(page.locator("#gpu-history")).to_have_count(0)
        # Runtime counts on while it runs.
        runtime = fact(page, "Runtime").inner_text()
        expect(fact(page, "Runtime")).not_to_have_text(runtime, timeout=WAIT)
        screenshot(page, "task-live-2-running-en")

        def sample() -> None:  # what the node agent records while the task holds its GPU
            GpuSample.objects.create(
                gpu=held, at=timezone.now(), task_id=watched.pk, tenant_id=watched.tenant_id,
                simulated=True, util_gpu=87, memory_used_mb=4096, memory_total_mb=24576,
            )  # fmt: skip

        orm(sample)
        second.touch()
        expect(state).to_contain_text("succeeded", timeout=WAIT)
        expect(timeline.last).to_contain_text("→ succeeded", timeout=WAIT)
        cells = page.locator("#attempts-section tbody tr td")
        expect(cells.nth(5)).to_have_text("0")  # the exit code
        expect(cells.last).to_contain_text("succeeded")
        expect(fact(page, "Exit code")).to_have_text("0")
        expect(page.locator("#gpus-section")).to_contain_text("It holds no GPU now.")
        # The chart now shows the history of the GPU the task held.
        page.wait_for_function(
            "window.gpTaskCharts && gpTaskCharts.chartPoints('gpu-chart-util') >= 1"
        )
        expect(page.locator("#gpu-history")).to_have_count(0)
        runtime = fact(page, "Runtime").inner_text()
        screenshot(page, "task-live-3-finished-en")
        assert page.evaluate("window.notReloaded") is True
        assert orm(lambda: Task.objects.get(pk=watched.pk).state) == "succeeded"
        browser.close()


def test_a_page_whose_socket_first_speaks_after_the_task_started_catches_up(site, people, gates):  # noqa: F811
    """The page rendered the task pending; its socket's first word says running (the task
    started while the page loaded): the page's parts must follow, not only its header."""
    first, second = gates / "first", gates / "second"
    held = []
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        page = sign_in(browser, site, "alice")
        # The log sockets wait here until the test lets them through.
        page.route_web_socket(re.compile(r"/ws/portal/tasks/\d+/log/"), lambda ws: held.append(ws))
        submit(page, "ahead", waits_for(first))
        submit(page, "late", waits_for(second))
        page.evaluate("window.notReloaded = true")
        expect(page.locator("#task-state")).to_contain_text("pending")
        expect(fact(page, "Node")).to_have_text("—")

        first.touch()
        late = Task.objects.filter(name="late", state="running")
        for _ in range(600):  # the launch: waited for, not timed
            if orm(late.exists):
                break
            time.sleep(0.1)
        assert orm(late.exists), "the task never started"
        held[-1].connect_to_server()
        expect(page.locator("#task-state")).to_contain_text("running", timeout=WAIT)
        expect(fact(page, "Node")).to_have_text("workstation-1", timeout=WAIT)
        expect(page.locator("#attempts-section tbody tr")).to_have_count(1)
        expect(page.locator("#gpu-charts #gpu-chart-util .uplot")).to_have_count(1)
        screenshot(page, "task-live-late-socket-en")
        assert page.evaluate("window.notReloaded") is True
        second.touch()
        browser.close()
