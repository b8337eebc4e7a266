"""The portal's Open link in headless Chromium: from a running service's task page, through the
gateway on real daphne, to the service's own page, signed in by the portal session alone; the
service is told who opened it. (JupyterLab is not needed: a small HTTP service stands in.)"""

from __future__ import annotations

import json

import pytest

from tests.browser import screenshot
from tests.gateway.conftest import run_service

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_open_link_opens_the_service_through_the_gateway(
    browser_page, browser_server, node, owner, outsider, start_service
):
    task = run_service(owner.tenant, node, start_service("lab-notebook").port, name="notebook")
    page = browser_page(owner.user)
    page.goto(f"{browser_server}/portal/tasks/{task.pk}/")
    assert page.locator("#service-health").inner_text() == "no health check"
    screenshot(page, "service-task-page")
    page.click("#service-open")
    page.wait_for_url(f"{browser_server}/services/{task.pk}/")
    assert page.locator("h1").inner_text() == "Hello from lab-notebook"
    screenshot(page, "service-open")
    page.goto(f"{browser_server}/services/{task.pk}/whoami")
    seen = json.loads(page.locator("body").inner_text())
    assert seen["headers"]["x-gpuplatform-user"] == "alice"
    # Another tenant's member, signed in too, finds nothing there.
    other = browser_page(outsider.user)
    answer = other.goto(f"{browser_server}/services/{task.pk}/")
    assert answer.status == 404
    assert "lab-notebook" not in other.content()
