"""The portal in headless Chromium against a real daphne that really launches tasks: a member
signs in, submits from the form, watches the task run with its log arriving live, clones it,
cancels the clone; a bad field is shown inline; a viewer and an outsider are refused; the
Chinese pages show nothing of the catalogue untranslated. Screenshots go to var/screenshots/."""

from __future__ import annotations

import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connections
from playwright.sync_api import expect, sync_playwright

from scheduling.models import Task
from tenants.models import Role
from tests.api.conftest import make_actor
from tests.factories import QuotaFactory, TaskFactory, TenantFactory
from tests.live import web_server
from tests.nodeagent.launcher.conftest import launcher, node  # noqa: F401 - fixtures
from tests.portal.browser import SCREENSHOTS, chromium, english_words, screenshot, untranslated

pytestmark = pytest.mark.slow

# A task that prints three lines a second apart: long enough to be seen running.
COMMAND = "for i in 1 2 3; do echo line-$i; sleep 1; done"


@pytest.fixture
def people(launcher, node):  # noqa: F811 - the fixtures imported above
    lab = TenantFactory(name="vision-lab")
    QuotaFactory(tenant=lab, max_gpus=4, max_running_tasks=4, max_queued_tasks=100)
    return {
        "alice": make_actor(lab, Role.ADMIN, "alice"),
        "dave": make_actor(lab, Role.VIEWER, "dave"),
        "charlie": make_actor(TenantFactory(name="nlp-lab"), Role.MEMBER, "charlie"),
    }


@pytest.fixture
def site(people, request, monkeypatch, settings):
    """daphne on a free port, launching tasks itself (tests run background work inline).

    Task directories live outside pytest's /tmp/pytest-of-<user>: a pytest run started
    meanwhile by anyone else on the host closes that directory to other users again, and the
    tenant's Unix user could no longer reach its work directory."""
    scratch = Path(tempfile.mkdtemp(prefix="gpuplatform-portal-"))
    scratch.chmod(0o711)
    for name, value in (("GPUPLATFORM_TASKS_ROOT", scratch / "tasks"),
                        ("GPUPLATFORM_TASK_LOG_DIR", scratch / "logs")):  # fmt: skip
        monkeypatch.setenv(name, str(value))
    settings.TASKS_ROOT, settings.TASK_LOG_DIR = scratch / "tasks", scratch / "logs"
    # exec, not fork: a web process holds a connection pool no child may inherit. Its log is
    # kept beside the screenshots for whoever looks into a failure.
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log = SCREENSHOTS / f"daphne-{request.node.name}.log"
    try:
        with web_server(log=log, SUPERVISOR_START="exec") as base:
            yield base
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def orm(read):
    """Run ``read`` in a thread of its own with its own connection, closed after. Playwright's
    sync API runs an event loop in the test's thread, where Django refuses the ORM (and its
    connections would outlive the test's teardown)."""

    def run():
        try:
            return read()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def sign_in(browser, base: str, username: str, locale: str = "en-GB", lands: str = r"/portal/$"):
    context = browser.new_context(
        base_url=base, locale=locale, viewport={"width": 1280, "height": 900}
    )
    page = context.new_page()
    page.goto("/")
    screenshot(page, f"login-{locale}")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    expect(page).to_have_url(re.compile(lands))
    return page


def test_a_member_submits_watches_clones_and_cancels(site, people):
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        page = sign_in(browser, site, "alice")
        page.click("nav.portal-nav >> text=Submit")
        page.fill("#id_task-name", "hello")
        page.fill("#id_task-command", COMMAND)
        page.fill("#id_task-gpus", "1")
        page.click("#task-form input[type=submit]")
        expect(page).to_have_url(re.compile(r"/portal/tasks/\d+/$"))
        page.evaluate("window.notReloaded = true")

        log = page.locator("#log-text")
        state = page.locator("#task-state")
        expect(log).to_contain_text("line-1", timeout=30_000)
        # The first line is there while the task still runs: it arrived live.
        expect(state).to_contain_text("running")
        expect(log).to_contain_text("line-3", timeout=15_000)
        expect(state).to_contain_text("succeeded", timeout=15_000)
        assert page.evaluate("window.notReloaded") is True
        # The page caught up without a reload: the exit code, the timeline, no Cancel button.
        expect(page.locator("#timeline-section")).to_contain_text("succeeded")
        expect(page.locator(".task-actions button[value=cancel]")).to_be_hidden()
        screenshot(page, "task-en")
        assert orm(lambda: Task.objects.get(name="hello").state) == "succeeded"

        page.click("text=Clone and edit")
        expect(page.locator("#id_task-name")).to_have_value("hello")
        expect(page.locator("#id_task-command")).to_have_value(COMMAND)
        page.fill("#id_task-name", "hello-again")
        page.fill("#id_task-command", "sleep 120")
        page.click("#task-form input[type=submit]")
        expect(page.locator("#task-state")).to_contain_text("running", timeout=30_000)
        clone = page.url
        page.goto("/portal/")
        screenshot(page, "overview-en")
        page.goto(clone)
        page.once("dialog", lambda dialog: dialog.accept())
        page.click(".task-actions button[value=cancel]")
        expect(page.locator("#task-state")).to_contain_text("cancelled", timeout=30_000)
        assert orm(lambda: Task.objects.get(name="hello-again").state) == "cancelled"

        page.goto("/portal/submit/")
        page.fill("#id_task-name", "bad")
        page.fill("#id_task-command", "true")
        page.fill("#id_task-gpus", "lots")
        page.click("#task-form input[type=submit]")
        expect(page.locator("#id_task-gpus_errors")).to_contain_text("whole number of GPUs")
        screenshot(page, "submit-error-en")
        assert not orm(lambda: Task.objects.filter(name="bad").exists())

        others = [("tasks-en", "/portal/tasks/"), ("usage-en", "/portal/usage/"),
                  ("tokens-en", "/portal/tokens/"), ("team-en", "/portal/team/")]  # fmt: skip
        for name, url in others:
            page.goto(url)
            screenshot(page, name)
        browser.close()


def test_a_viewer_and_an_outsider_are_refused(site, people):
    task = TaskFactory(tenant=people["alice"].tenant, owner=people["alice"].user, name="lab")
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        viewer = sign_in(browser, site, "dave")
        expect(viewer.locator("nav.portal-nav")).not_to_contain_text("Submit")
        status = viewer.evaluate("""async () => {
            const token = document.querySelector("[name=csrfmiddlewaretoken]").value;
            const body = new URLSearchParams({mode: "yaml", "yaml-spec": "name: x\\ncommand: ls"});
            const response = await fetch("/portal/submit/", {method: "POST", body,
                headers: {"X-CSRFToken": token}});
            return response.status;
        }""")
        assert status == 403
        assert orm(Task.objects.count) == 1

        outsider = sign_in(browser, site, "charlie")
        response = outsider.goto(f"/portal/tasks/{task.pk}/")
        assert response.status == 404
        outsider.goto("/portal/")
        code = outsider.evaluate(
            """(id) => new Promise((resolve) => {
                const ws = new WebSocket(`ws://${location.host}/ws/portal/tasks/${id}/log/`);
                ws.onclose = (event) => resolve(event.code);
            })""",
            task.pk,
        )
        assert code == 4404
        browser.close()


def test_the_chinese_pages_leave_nothing_untranslated(site, people):
    task = TaskFactory(tenant=people["alice"].tenant, owner=people["alice"].user, name="训练")
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        page = sign_in(browser, site, "alice", locale="zh-CN")
        pages = [("overview-zh", "/portal/"), ("task-pending-zh", f"/portal/tasks/{task.pk}/"),
                 ("tasks-zh", "/portal/tasks/"), ("submit-zh", "/portal/submit/"),
                 ("submit-yaml-zh", "/portal/submit/?mode=yaml"), ("usage-zh", "/portal/usage/"),
                 ("tokens-zh", "/portal/tokens/"), ("team-zh", "/portal/team/")]  # fmt: skip
        for name, url in pages:
            page.goto(url)
            expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
            assert untranslated(page) == [], url
            screenshot(page, name)
        # A task run from the Chinese form: its page with a log, as the READMEs show it.
        page.goto("/portal/submit/")
        page.fill("#id_task-name", "train-lr")
        page.fill("#id_task-command", "echo 第1轮 loss=0.91; sleep 1; echo 第2轮 loss=0.47")
        page.click("#task-form input[type=submit]")
        expect(page.locator("#task-state")).to_contain_text("已成功", timeout=30_000)
        expect(page.locator("#log-text")).to_contain_text("第2轮")
        expect(page.locator("#attempts-section")).to_contain_text("已成功")
        assert untranslated(page) == []
        screenshot(page, "task-zh")
        browser.close()


def user_data() -> list[str]:
    """What people typed or the estate is named, in whatever language: names of tasks,
    tenants, users, tokens, nodes, pools and GPUs, commands, GPU UUIDs."""
    from django.contrib.auth import get_user_model

    from scheduling.models import GPU, Node, Pool
    from tenants.models import ApiToken, Tenant

    return [
        *(text for task in Task.objects.all() for text in (task.name, task.command)),
        *Tenant.objects.values_list("name", flat=True),
        *get_user_model().objects.values_list("username", flat=True),
        *get_user_model().objects.values_list("email", flat=True),
        *(text for token in ApiToken.objects.all() for text in (token.name, token.prefix)),
        *Node.objects.values_list("name", flat=True),
        *Pool.objects.values_list("name", flat=True),
        *(text for gpu in GPU.objects.all() for text in (gpu.model, gpu.gpu_type, gpu.uuid)),
    ]


def test_the_chinese_pages_and_dashboard_show_no_english_words(site, people, node):  # noqa: F811
    """Every Chinese portal page and the dashboard, with tasks that really ran (submitted,
    placed, started, ended with 0 and with 3), shows no English word but product names and
    what people typed."""
    make_actor(people["alice"].tenant, Role.ADMIN, "olga", staff=True)
    ran = {"ok": "echo 完成", "bad": "exit 3"}
    with sync_playwright() as playwright:
        browser = chromium(playwright)
        page = sign_in(browser, site, "alice", locale="zh-CN")
        for name, command in ran.items():
            page.goto("/portal/submit/")
            page.fill("#id_task-name", name)
            page.fill("#id_task-command", command)
            page.click("#task-form input[type=submit]")
            expect(page.locator("#task-state")).to_contain_text(
                "已成功" if name == "ok" else "已失败", timeout=30_000
            )
        tasks = orm(lambda: list(Task.objects.order_by("pk")))
        typed = orm(user_data)
        pages = [("overview", "/portal/"), ("tasks", "/portal/tasks/"),
                 *((f"task-{t.name}", f"/portal/tasks/{t.pk}/") for t in tasks),
                 ("submit", "/portal/submit/"), ("submit-yaml", "/portal/submit/?mode=yaml"),
                 ("spec", "/portal/spec/"), ("usage", "/portal/usage/"),
                 ("team", "/portal/team/"), ("tokens", "/portal/tokens/"),
                 ("password", "/accounts/password/")]  # fmt: skip
        found = {}
        for name, url in pages:
            page.goto(url)
            found[url] = english_words(page, typed)
            screenshot(page, f"words-zh-{name}")
        operator = sign_in(browser, site, "olga", locale="zh-CN", lands=r"/(portal|dashboard)/$")
        operator.goto("/dashboard/")
        found["/dashboard/"] = english_words(operator, typed)
        screenshot(operator, "words-zh-dashboard")
        browser.close()
    english = {url: words for url, words in found.items() if words}
    assert english == {}, english
