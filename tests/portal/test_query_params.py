"""The portal's query parameters are read by serializers as the API's are: a value a page cannot
read answers a 400 page naming the parameter and the reason, never a 500; the tenant acted
for comes from tenants.access as the API's does."""

from __future__ import annotations

import pytest

from scheduling.models import TaskAttempt
from tenants.models import Membership, Role
from tests.factories import NodeFactory, TaskFactory, TenantFactory
from tests.portal.conftest import browser

pytestmark = pytest.mark.django_db

TOO_BIG = "99999999999999999999"


@pytest.fixture
def task(owner, tmp_path):
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, state="running", attempt=1)
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"hello\n")
    TaskAttempt.objects.create(task=task, number=1, node=NodeFactory(), log_path=str(log))
    return task


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/portal/tasks/?after=" + TOO_BIG, "after"),
        ("/portal/tasks/?after=12.3", "after"),  # two parts: a cursor of another sort
        ("/portal/tasks/?sort=sideways", "sort"),
        ("/portal/tasks/?state=runing", "state"),
        ("/portal/tasks/?owner=someone", "owner"),
        ("/portal/usage/?days=14", "days"),
        ("/portal/usage.csv?days=" + TOO_BIG, "days"),
        ("/portal/submit/?clone=²", "clone"),  # "²".isdigit() is True, int("²") refused
        ("/portal/submit/?clone=" + TOO_BIG, "clone"),
        ("/portal/submit/?mode=xml", "mode"),
        ("/portal/tasks/{pk}/log/?attempt=²", "attempt"),
        ("/portal/tasks/{pk}/log/?attempt=2147483648", "attempt"),
    ],
)
def test_a_parameter_a_page_cannot_read_answers_400_naming_it(owner, task, url, field):
    response = browser(owner).get(url.format(pk=task.pk))
    assert response.status_code == 400
    assert field in response.context["problems"], response.context["problems"]
    assert f"<code>{field}</code>" in response.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        "/portal/tasks/?state=running&state=pending&sort=priority&owner=me&q=task&queue=",
        "/portal/tasks/?after=5&sort=oldest",
        "/portal/tasks/?after=50.5&sort=priority",
        "/portal/usage/?days=7",
        "/portal/submit/?clone={pk}&mode=yaml",
        "/portal/tasks/{pk}/log/?attempt=1",
    ],
)
def test_parameters_the_pages_write_themselves_are_read(owner, task, url):
    assert browser(owner).get(url.format(pk=task.pk)).status_code == 200


def test_a_log_of_an_attempt_that_does_not_exist_is_a_404(owner, task):
    assert browser(owner).get(f"/portal/tasks/{task.pk}/log/?attempt=7").status_code == 404


def test_the_portal_acts_for_a_tenant_named_in_the_query(owner):
    other = TenantFactory(name="robotics")
    Membership.objects.create(user=owner.user, tenant=other, role=Role.VIEWER)
    TaskFactory(tenant=other, owner=owner.user, name="robot-arm")
    page = browser(owner).get("/portal/tasks/?tenant=robotics")
    assert [t.name for t in page.context["tasks"]] == ["robot-arm"]


def test_naming_a_tenant_one_is_not_in_is_refused_saying_which(owner, outsider):
    response = browser(owner).get("/portal/tasks/?tenant=nlp-lab")
    assert response.status_code == 403
    assert "you are not a member of tenant nlp-lab" in response.content.decode()
