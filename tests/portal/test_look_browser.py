"""How the portal and the admin look at 1280 x 900, in headless Chromium against a real daphne:
the submit form offers the inventory and lines its labels and fields up, the YAML editor opens
with an example and a link to the spec reference, the footer starts where the content does,
the icon is linked and answers, and the admin's GPU, node and task lists fit the window.
Screenshots go to var/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from scheduling.models import Node
from tests.browser import screenshot
from tests.factories import QuotaFactory, TaskFactory, TenantFactory, UserFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 900

# Where an element's content starts: its box's left edge inside its border and padding.
CONTENT_LEFT = """(selector) => {
  const el = document.querySelector(selector);
  const style = getComputedStyle(el);
  return Math.round(el.getBoundingClientRect().left + parseFloat(style.borderLeftWidth)
                    + parseFloat(style.paddingLeft));
}"""

LEFT_EDGES = "(els) => els.map((el) => Math.round(el.getBoundingClientRect().left))"

# What a changelist cuts off: a results box wider than itself or than the window, and every
# cell (heading or value) whose text is wider than the cell shows.
CUT_OFF = """() => {
  const cut = [];
  const box = document.querySelector("#changelist-form .results");
  const over = box.scrollWidth - box.clientWidth;
  if (over > 0) cut.push(`the table overflows its box by ${over} px`);
  if (box.getBoundingClientRect().right > document.documentElement.clientWidth) {
    cut.push("the table's box passes the window");
  }
  const cells = document.querySelectorAll("#result_list th, #result_list td, #result_list th *");
  for (const cell of cells) {
    if (cell.scrollWidth > cell.clientWidth + 1) cut.push(cell.innerText.trim());
  }
  return cut;
}"""


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


def test_the_gpu_type_and_pool_are_choices_with_what_is_free_and_what_the_quota_allows(
    browser_page, browser_server, owner, workstation
):
    QuotaFactory(tenant=owner.tenant, max_gpus=2)
    page = browser_page(owner.user, width=WIDTH, height=HEIGHT)
    page.goto(f"{browser_server}/portal/submit/")
    assert page.locator("#id_task-gpu_type option").all_inner_texts() == [
        "any type: 4 of 4 free; your quota allows 2 more",
        "rtx4090-24g: 4 of 4 free; your quota allows 2 more",
    ]
    assert page.locator("#id_task-pool option").all_inner_texts() == [
        "any pool: 4 of 4 free; your quota allows 2 more",
        "default: 4 of 4 free; your quota allows 2 more",
    ]
    page.select_option("#id_task-gpu_type", "rtx4090-24g")
    screenshot(page, "submit-form-en")


def test_the_submit_forms_labels_and_fields_line_up(browser_page, browser_server, owner):
    page = browser_page(owner.user, width=WIDTH, height=HEIGHT)
    page.goto(f"{browser_server}/portal/submit/")
    labels = page.eval_on_selector_all("#task-form .form-row label", LEFT_EDGES)
    fields = page.eval_on_selector_all(
        "#task-form .form-row :is(input, select, textarea)", LEFT_EDGES
    )
    assert len(labels) == len(fields) == 18  # the service section's four included
    assert len(set(labels)) == 1, labels
    assert len(set(fields)) == 1, fields
    assert fields[0] > labels[0]


def test_the_yaml_editor_opens_with_an_example_and_a_link_to_the_spec_reference(
    browser_page, browser_server, owner, workstation
):
    page = browser_page(owner.user, width=WIDTH, height=HEIGHT)
    page.goto(f"{browser_server}/portal/submit/?mode=yaml")
    text = page.input_value("#id_yaml-spec")
    for key in ("name:", "command:", "gpus:", "gpu_memory:", "queue:", "timeout:", "# kind: sweep"):
        assert key in text, text
    # The example is a spec the server accepts: the editor's count says one task.
    expect(page.locator("#sweep-preview")).to_have_text("This spec submits 1 task(s).")
    screenshot(page, "submit-yaml-en")
    with page.context.expect_page() as opened:
        page.click("#spec-reference a")
    reference = opened.value
    reference.wait_for_load_state()
    assert reference.url == f"{browser_server}/portal/spec/"
    expect(reference.locator("#spec-help")).to_contain_text("resources.gpu_memory")
    screenshot(reference, "spec-reference-en")


@pytest.mark.parametrize("width", [WIDTH, 900, 375])
def test_the_footer_starts_where_the_content_does(browser_page, browser_server, owner, width):
    page = browser_page(owner.user, width=width, height=HEIGHT)
    for path in ("/portal/", "/portal/submit/"):
        page.goto(f"{browser_server}{path}")
        content = page.evaluate(CONTENT_LEFT, "#content")
        footer = page.evaluate(CONTENT_LEFT, ".portal-footer")
        assert (path, footer) == (path, content)
    if width == WIDTH:
        screenshot(page, "footer-en")


def test_the_portal_and_the_admin_link_an_icon_that_answers(
    browser_page, browser_server, owner, root
):
    for user, path in ((owner.user, "/portal/"), (root, "/admin/")):
        page = browser_page(user, width=WIDTH, height=HEIGHT)
        page.goto(f"{browser_server}{path}")
        icon = page.locator("link[rel=icon]")
        assert icon.count() == 1, path
        answer = page.request.get(browser_server + icon.get_attribute("href"))
        assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg")
    favicon = page.request.get(f"{browser_server}/favicon.ico")
    assert favicon.status == 200 and favicon.headers["content-type"].startswith("image/svg")


def test_the_admin_gpu_node_and_task_lists_fit_1280_pixels(
    browser_page, browser_server, root, workstation
):
    Node.objects.filter(pk=workstation.pk).update(
        hostname="workstation-1.lab.example.org",
        isolation="tenant users; GPU devices fenced (cgroup v1 devices); private /tmp",
        state="draining",
        state_reason="drained by olga: replacing a fan",
    )
    lab = TenantFactory(name="vision-lab")
    TaskFactory(
        tenant=lab,
        name="resnet50-imagenet-lr-sweep-0",
        queue="experiments",
        gpus_min=2,
        gpus_max=4,
        gpu_memory_mb=20 * 1024,
        reason="needs 2-4 x rtx4090-24g on one node in pool default; 0 idle now",
    )
    TaskFactory(tenant=lab, name="serve", state="running", node=workstation)
    page = browser_page(root, width=WIDTH, height=HEIGHT)
    cut = {}
    for name in ("gpu", "node", "task"):
        page.goto(f"{browser_server}/admin/scheduling/{name}/")
        screenshot(page, f"admin-{name}s-1280")
        cut[name] = page.evaluate(CUT_OFF)
    assert cut == {"gpu": [], "node": [], "task": []}
