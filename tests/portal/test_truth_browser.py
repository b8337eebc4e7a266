"""What the portal shows, in headless Chromium against a real daphne, equals what the API says:
the overview's free GPUs are the API's GPUs that are available, on an available node, and that
no task holds, on a fresh install and with GPUs busy, shared and drained."""

from __future__ import annotations

import json
import urllib.request

import pytest
from playwright.sync_api import sync_playwright

from scheduling.models import GPU, GpuState
from tenants.models import Role
from tests.api.conftest import make_actor
from tests.factories import AllocationFactory, NodeFactory, TaskFactory, TenantFactory, make_gpus
from tests.live import web_server
from tests.portal.browser import SCREENSHOTS, chromium, screenshot
from tests.portal.test_browser import orm, sign_in

pytestmark = pytest.mark.slow


@pytest.fixture
def estate(transactional_db):
    node = NodeFactory(name="workstation-1")
    gpus = make_gpus(node, count=4)
    lab = TenantFactory(name="vision-lab")
    return {"alice": make_actor(lab, Role.ADMIN, "alice"), "gpus": gpus, "lab": lab}


def free_in_api(base: str, token: str) -> int:
    """The GPUs the API says a new task could take whole: available, on an available node,
    not in use."""

    def get(path: str) -> list[dict]:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.load(response)
        return body["results"] if isinstance(body, dict) else body

    nodes = {n["name"]: n["state"] for n in get("/api/v1/nodes/")}
    return sum(
        1
        for gpu in get("/api/v1/gpus/")
        if gpu["state"] == "available" and nodes[gpu["node"]] == "available" and not gpu["in_use"]
    )


def free_on_overview(page) -> int:
    page.goto("/portal/")
    cells = page.locator("section[aria-labelledby=free] tbody tr td:last-child").all_inner_texts()
    return sum(int(text) for text in cells)


def test_the_overview_counts_the_free_gpus_the_api_lists(estate):
    alice, gpus = estate["alice"], estate["gpus"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with web_server(log=SCREENSHOTS / "daphne-truth.log") as base:
        with sync_playwright() as playwright:
            page = sign_in(chromium(playwright), base, "alice")
            seen = {}
            # Fresh: no GPU has ever held a task.
            seen["fresh"] = (free_on_overview(page), free_in_api(base, alice.token))
            screenshot(page, "overview-fresh-en")

            def busy_shared_drained():
                whole = TaskFactory(tenant=estate["lab"], state="running")
                AllocationFactory(task=whole, gpu=gpus[0], exclusive=True, memory_mb=24576)
                sharing = TaskFactory(tenant=estate["lab"], state="running")
                AllocationFactory(task=sharing, gpu=gpus[1], memory_mb=4096)
                GPU.objects.filter(pk=gpus[3].pk).update(state=GpuState.DRAINING)

            orm(busy_shared_drained)
            seen["busy"] = (free_on_overview(page), free_in_api(base, alice.token))
            screenshot(page, "overview-busy-en")
    assert seen == {"fresh": (4, 4), "busy": (1, 1)}
