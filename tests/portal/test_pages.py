"""The portal's pages through Django's test client: who lands where, what each role may see and
do, forms that refuse bad input beside the field, and a task list whose cost does not grow with
the tenant's tasks."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.models import Task
from tests.factories import TaskFactory, UserFactory
from tests.portal.conftest import browser

pytestmark = pytest.mark.django_db


# --- Landing, signing in --------------------------------------------------------------------------


def test_anonymous_visitors_land_on_the_sign_in_page_not_the_admins():
    response = browser().get("/", follow=True)
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    assert b"staff account" not in response.content
    assert b"Sign in to gpuplatform" in response.content


def test_a_tenant_member_signs_in_and_lands_on_the_portal(owner):
    client = browser()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"}, follow=True)
    assert response.redirect_chain[-1][0] == "/portal/"
    assert b"My running and pending tasks" in response.content


def test_operators_land_on_the_operations_pages(db):
    staff = UserFactory(username="olga", is_staff=True)
    client = browser()
    client.force_login(staff)
    response = client.get("/")
    assert response.status_code == 302
    assert response.url == "/dashboard/"


def test_a_user_in_no_tenant_is_told_so(db):
    client = browser()
    client.force_login(UserFactory(username="nobody"))
    response = client.get("/portal/")
    assert response.status_code == 403
    assert b"No tenant yet" in response.content


def test_sign_in_is_throttled_per_username(owner, settings):
    settings.LOGIN_THROTTLE_RATE = "3/min"
    settings.API_THROTTLE_BURST = 3
    client = browser()
    codes = [
        client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code
        for _ in range(5)
    ]
    assert codes[:3] == [200, 200, 200]
    assert codes[3:] == [429, 429]
    refused = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert refused.status_code == 429, "the right password does not skip the pace"
    assert b"Too many sign-in attempts" in refused.content


def test_password_change_and_sign_out(owner):
    client = browser(owner)
    response = client.post(
        "/accounts/password/",
        {"old_password": "pw", "new_password1": "a-long-new-pass-42", "new_password2":
         "a-long-new-pass-42"},
    )  # fmt: skip
    assert response.status_code == 302
    owner.user.refresh_from_db()
    assert owner.user.check_password("a-long-new-pass-42")
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/portal/").status_code == 302


# --- Pages and roles ------------------------------------------------------------------------------


PAGES = ["/portal/", "/portal/tasks/", "/portal/submit/", "/portal/usage/", "/portal/tokens/",
         "/portal/team/", "/portal/usage.csv"]  # fmt: skip


def test_a_tenant_admin_opens_every_page(owner, bobs_task, workstation):
    client = browser(owner)
    for url in [*PAGES, f"/portal/tasks/{bobs_task.pk}/"]:
        assert client.get(url).status_code == 200, url


def test_a_viewer_sees_no_submit_button_and_gets_403_posting_anyway(viewer, bobs_task):
    client = browser(viewer)
    overview = client.get("/portal/").content.decode()
    assert 'href="/portal/submit/"' not in overview
    detail = client.get(f"/portal/tasks/{bobs_task.pk}/").content.decode()
    assert "Clone and edit" not in detail and "/cancel/" not in detail
    form = {"mode": "yaml", "yaml-spec": "name: x\ncommand: 'true'\n"}
    assert client.post("/portal/submit/", form).status_code == 403
    assert client.post(f"/portal/tasks/{bobs_task.pk}/cancel/").status_code == 403
    assert client.get("/portal/team/").status_code == 403
    assert Task.objects.count() == 1


def test_a_tasks_parts_are_the_pages_own_sections(owner, bobs_task):
    """What the page swaps in as the task changes is what a reload would show, part by part."""
    client = browser(owner)
    page = client.get(f"/portal/tasks/{bobs_task.pk}/").content.decode()
    parts = client.get(f"/portal/tasks/{bobs_task.pk}/parts/").content.decode()
    ids = re.findall(r'id="([\w-]+)" data-live-part', parts)
    assert ids == ["task-head", "task-actions", "facts-section", "gpus-section", "gpu-charts",
                   "timeline-section", "attempts-section"]  # fmt: skip
    # Each form's CSRF token is masked afresh per response.
    page, parts = (
        re.sub(r'name="csrfmiddlewaretoken" value="\w+"', "", html) for html in (page, parts)
    )
    for whole in re.finditer(r"<(section|div)[^>]* data-live-part.*?\n</\1>", parts, re.DOTALL):
        assert whole.group(0) in page, whole.group(0)[:80]
    assert f'data-parts="/portal/tasks/{bobs_task.pk}/parts/"' in page


def test_a_tasks_parts_are_read_only_and_show_a_viewer_no_controls(viewer, bobs_task):
    client = browser(viewer)
    parts = client.get(f"/portal/tasks/{bobs_task.pk}/parts/").content.decode()
    assert "/cancel/" not in parts and "Clone and edit" not in parts
    assert client.post(f"/portal/tasks/{bobs_task.pk}/parts/").status_code == 405
    assert browser().get(f"/portal/tasks/{bobs_task.pk}/parts/").status_code == 302  # sign in


def test_a_member_controls_only_its_own_tasks(owner, teammate, bobs_task):
    alices = TaskFactory(tenant=owner.tenant, owner=owner.user)
    client = browser(teammate)
    assert client.post(f"/portal/tasks/{alices.pk}/cancel/").status_code == 403
    assert client.post(f"/portal/tasks/{bobs_task.pk}/cancel/").status_code == 302
    bobs_task.refresh_from_db()
    assert bobs_task.state == "cancelled"


def test_another_tenants_task_is_not_found(outsider, bobs_task):
    client = browser(outsider)
    for url in (f"/portal/tasks/{bobs_task.pk}/", f"/portal/tasks/{bobs_task.pk}/log/",
                f"/portal/tasks/{bobs_task.pk}/parts/",
                f"/portal/submit/?clone={bobs_task.pk}"):  # fmt: skip
        assert client.get(url).status_code == 404, url
    assert client.post(f"/portal/tasks/{bobs_task.pk}/cancel/").status_code == 404
    bobs_task.refresh_from_db()
    assert bobs_task.state == "pending"


def test_bulk_cancel_cancels_own_tasks_and_names_the_rest(owner, teammate, bobs_task):
    alices = TaskFactory(tenant=owner.tenant, owner=owner.user)
    client = browser(teammate)
    response = client.post("/portal/tasks/", {"task": [bobs_task.pk, alices.pk]}, follow=True)
    assert response.status_code == 200
    assert Task.objects.get(pk=bobs_task.pk).state == "cancelled"
    assert Task.objects.get(pk=alices.pk).state == "pending"
    assert f"#{alices.pk}".encode() in response.content


def test_a_user_in_two_tenants_switches_between_them(owner, outsider, foreign_task):
    from tests.factories import MembershipFactory

    MembershipFactory(user=owner.user, tenant=outsider.tenant, role="viewer")
    client = browser(owner)
    assert client.post("/portal/tenant/", {"tenant": "vision-lab"}).status_code == 302
    assert client.get(f"/portal/tasks/{foreign_task.pk}/").status_code == 404
    assert client.post("/portal/tenant/", {"tenant": "nlp-lab"}).status_code == 302
    assert client.get(f"/portal/tasks/{foreign_task.pk}/").status_code == 200
    assert client.post("/portal/tenant/", {"tenant": "not-mine"}).status_code == 404


# --- Submitting -----------------------------------------------------------------------------------


def _form(**fields):
    base = {"mode": "form", "task-name": "train", "task-command": "python train.py",
            "task-gpus": "1", "task-priority": "normal", "task-task_class": "batch",
            "task-retries": "0"}  # fmt: skip
    base.update({f"task-{k}": v for k, v in fields.items()})
    return base


def test_the_form_submits_a_task_as_the_api_would(teammate, workstation):
    response = browser(teammate).post("/portal/submit/", _form(timeout="1h", env="A=1\nB=two"))
    task = Task.objects.get()
    assert response.status_code == 302 and response.url == f"/portal/tasks/{task.pk}/"
    assert (task.owner, task.timeout_s, task.env) == (teammate.user, 3600, {"A": "1", "B": "two"})


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpus": "lots"}, "gpus", "whole number of GPUs"),
        ({"timeout": "soon"}, "timeout", "expected a duration"),
        ({"pool": "nowhere"}, "pool", "unknown pool"),
        ({"env": "LD_PRELOAD=/x.so"}, "env", "LD_PRELOAD"),
        ({"gpus": "9"}, "gpus", "largest matching node has 4"),
        ({"after": "7, 7"}, "after", "duplicate 7"),  # policy.after[1]
    ],
)
def test_a_bad_field_is_shown_beside_it_and_nothing_is_stored(
    teammate, workstation, fields, field, words
):
    response = browser(teammate).post("/portal/submit/", _form(**fields))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors, errors
    assert words in " ".join(errors[field])
    assert f'id="id_task-{field}_errors"' in response.content.decode()
    assert Task.objects.count() == 0


def test_yaml_sweeps_are_counted_before_submitting_and_then_submitted(teammate, workstation):
    sweep = (
        "kind: sweep\nname: lr\nparameters: {lr: [1, 2, 3]}\n"
        "template: {command: 'python train.py --lr {lr}'}\n"
    )
    client = browser(teammate)
    preview = client.post("/portal/submit/preview/", {"spec": sweep}).json()
    assert preview["count"] == 3
    bad = client.post("/portal/submit/preview/", {"spec": "name: [\n"})
    assert bad.status_code == 400 and "yaml" in bad.json()["errors"]
    assert Task.objects.count() == 0
    response = client.post("/portal/submit/", {"mode": "yaml", "yaml-spec": sweep})
    assert response.status_code == 302
    assert Task.objects.count() == 3


def test_the_yaml_editor_lists_every_key_of_a_spec_with_its_limits(teammate):
    from scheduling.spec import MAX_COMMAND_LENGTH, MAX_GPUS

    page = browser(teammate).get("/portal/submit/?mode=yaml").content.decode()
    help_table = page.split('id="spec-help"')[1]
    assert "<code>resources.gpus</code>" in help_table and f"0 to {MAX_GPUS}" in help_table
    assert f"at most {MAX_COMMAND_LENGTH} characters" in help_table
    assert "<code>parameters</code>" in help_table  # a sweep's own keys
    chinese = browser(teammate, language="zh-hans").get("/portal/submit/?mode=yaml")
    assert f"最多 {MAX_COMMAND_LENGTH} 个字符" in chinese.content.decode()
    assert 'id="spec-help"' not in browser(teammate).get("/portal/submit/").content.decode()


def test_clone_and_edit_fills_the_form_from_a_past_task(teammate, workstation):
    browser(teammate).post("/portal/submit/", _form(name="orig", queue="sft", timeout="2h"))
    task = Task.objects.get()
    page = browser(teammate).get(f"/portal/submit/?clone={task.pk}")
    initial = page.context["form"].initial
    assert (initial["name"], initial["queue"], initial["timeout"]) == ("orig", "sft", "2h")
    yaml_page = browser(teammate).get(f"/portal/submit/?clone={task.pk}&mode=yaml")
    assert "name: orig" in yaml_page.content.decode()


# --- Tokens and team ------------------------------------------------------------------------------


def test_a_token_is_shown_once_and_can_be_revoked(teammate):
    client = browser(teammate)
    created = client.post("/portal/tokens/", {"name": "laptop"}).content.decode()
    assert "gpup_" in created and "Copy" in created
    listed = client.get("/portal/tokens/").content.decode()
    assert "laptop" in listed and "gpup_" not in listed.split("<table")[0].split("new-token")[-1]
    token = teammate.user.api_tokens.get(name="laptop")
    assert client.post(f"/portal/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_member_cannot_revoke_a_teammates_token(owner, teammate):
    token = owner.user.api_tokens.get()
    assert browser(teammate).post(f"/portal/tokens/{token.pk}/revoke/").status_code == 404


def test_a_tenant_admin_adds_a_member_and_keeps_the_last_admin(owner):
    UserFactory(username="erin")
    client = browser(owner)
    assert client.post("/portal/team/", {"username": "erin", "role": "member"}).status_code == 302
    assert owner.tenant.memberships.filter(user__username="erin", role="member").exists()
    refused = client.post("/portal/team/", {"username": "alice", "role": "viewer"})
    assert refused.status_code == 400
    assert "needs an admin" in refused.content.decode()
    unknown = client.post("/portal/team/", {"username": "ghost", "role": "member"})
    assert unknown.status_code == 400 and "No such user" in unknown.content.decode()


# --- The task list at scale -----------------------------------------------------------------------


def _queries(client, url: str) -> int:
    client.get(url)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize("url", ["/portal/tasks/", "/portal/tasks/?sort=priority&state=pending",
                                 "/portal/", "/portal/tasks/{pk}/",
                                 "/portal/tasks/{pk}/parts/"])  # fmt: skip
def test_pages_cost_the_same_queries_with_one_task_or_many(owner, teammate, workstation, url):
    first = TaskFactory(tenant=owner.tenant, owner=owner.user)
    client = browser(owner)
    url = url.format(pk=first.pk)
    few = _queries(client, url)
    for i in range(30):
        TaskFactory(tenant=owner.tenant, owner=teammate.user if i % 2 else owner.user)
    assert _queries(client, url) == few


def test_pages_follow_on_by_keyset_without_repeating_or_skipping(owner):
    made = [TaskFactory(tenant=owner.tenant, priority=10 * (i % 5)).pk for i in range(120)]
    client = browser(owner)
    for sort in ("newest", "oldest", "priority"):
        seen, url = [], f"/portal/tasks/?sort={sort}"
        while url:
            response = client.get(url)
            page = [t.pk for t in response.context["tasks"]]
            assert len(page) <= 50
            seen += page
            following = response.context["next_query"]
            url = f"/portal/tasks/?{following}" if following else None
        assert sorted(seen) == sorted(made) and len(seen) == len(set(seen)), sort


# --- Languages ------------------------------------------------------------------------------------


def test_the_browsers_language_picks_chinese_and_the_switcher_keeps_it(owner):
    page = browser(owner, language="zh-CN,zh;q=0.9").get("/portal/").content.decode()
    assert "概览" in page and 'lang="zh-hans"' in page
    client = browser(owner)
    assert "Overview" in client.get("/portal/").content.decode()
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/portal/"})
    assert "概览" in client.get("/portal/").content.decode()


def test_the_api_answers_in_chinese_when_asked(viewer, bobs_task):
    from tests.api.conftest import bearer

    client = bearer(viewer.token)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {viewer.token}", HTTP_ACCEPT_LANGUAGE="zh-CN")
    refused = client.post(f"/api/v1/tasks/{bobs_task.pk}/cancel/")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "你在此租户中的角色只能查看"
    assert client.get("/api/v1/tasks/999999/").json()["detail"] == "未找到"
    english = bearer(viewer.token).post(f"/api/v1/tasks/{bobs_task.pk}/cancel/")
    assert english.json()["detail"] == "your role in this tenant may only read"


@pytest.mark.parametrize(
    ("body", "field", "english", "chinese"),
    [
        ({"resources": {"gpus": 65}}, "resources.gpus", "must be from 0 to 64, got 65",
         "必须在 0 到 64 之间，实际为 65"),
        ({"comand": "x"}, "comand", "unknown key; did you mean 'command'?",
         "未知的键；你是不是想写 'command'？"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env.LD_PRELOAD",
         "cannot be set: it changes how the dynamic loader starts every program, the platform's "
         "launcher included",
         "不能设置：它会改变动态链接器启动每个程序的方式，包括平台自己的启动器"),
        ({"resources": {"gpus": 8}}, "resources.gpus",
         "asks for 8 GPUs on one node, but the largest matching node has 4",
         "要求在一个节点上使用 8 块 GPU，但符合条件的最大节点只有 4 块"),
    ],
    ids=["spec-range", "spec-unknown-key", "spec-reserved-env", "submit-infeasible"],
)  # fmt: skip
def test_a_bad_spec_is_refused_in_the_callers_language(
    teammate, workstation, body, field, english, chinese
):
    from tests.api.conftest import bearer

    spec = {"name": "train", "command": "python train.py", **body}
    client = bearer(teammate.token)
    assert client.post("/api/v1/tasks/", spec, format="json").json()["errors"][field] == [english]
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {teammate.token}", HTTP_ACCEPT_LANGUAGE="zh-hans"
    )
    refused = client.post("/api/v1/tasks/", spec, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"][field] == [chinese]
    assert Task.objects.count() == 0


def test_the_submit_form_shows_spec_errors_in_chinese(teammate, workstation):
    response = browser(teammate, language="zh-hans").post("/portal/submit/", _form(gpus="lots"))
    assert response.status_code == 400
    assert "必须是 GPU 的整数个数" in " ".join(response.context["form"].errors["gpus"])


def test_only_tenant_admins_see_the_quota_and_fair_share(owner, teammate):
    from tests.factories import QuotaFactory

    QuotaFactory(tenant=owner.tenant, max_gpus=4)
    assert "Fair share" in browser(owner).get("/portal/").content.decode()
    page = browser(teammate).get("/portal/").content.decode()
    assert "Fair share" not in page and "<progress" not in page
    assert "Only the tenant's admins see its quota" in page


# --- GPU charts on the task page ------------------------------------------------------------------


def _running_with_samples(tenant, user, gpus, seconds: int):
    """A running task on ``gpus`` that has ``seconds`` samples a second of each."""
    from datetime import timedelta

    from django.utils import timezone

    from telemetry.models import GpuSample
    from tests.factories import AllocationFactory

    started = timezone.now() - timedelta(seconds=seconds + 5)
    task = TaskFactory(tenant=tenant, owner=user, state="running", node=gpus[0].node,
                       started_at=started)  # fmt: skip
    for gpu in gpus:
        AllocationFactory(task=task, gpu=gpu, started_at=started)
    GpuSample.objects.bulk_create(
        GpuSample(gpu=gpu, at=started + timedelta(seconds=s + 1), task=task, util_gpu=40 + i,
                  memory_used_mb=1000 * (i + 1), memory_total_mb=gpu.memory_mb, simulated=True)
        for s in range(seconds) for i, gpu in enumerate(gpus)
    )  # fmt: skip
    return task


def test_the_task_page_charts_its_gpus_history_labelled_simulated(owner, workstation):
    gpus = list(workstation.gpus.order_by("index"))[:2]
    task = _running_with_samples(owner.tenant, owner.user, gpus, 20)
    response = browser(owner).get(f"/portal/tasks/{task.pk}/")
    charts = response.context["gpu_charts"]
    assert [g["index"] for g in charts["gpus"]] == [0, 1]
    assert len(charts["gpus"][0]["points"]) > 1
    assert {p[1] for p in charts["gpus"][1]["points"]} == {41.0}
    assert {p[2] for p in charts["gpus"][1]["points"]} == {2000.0}
    assert charts["simulated"] and charts["running"]
    page = response.content.decode()
    assert 'id="gpu-charts-data"' in page and "simulated GPUs" in page
    chinese = browser(owner, language="zh-hans").get(f"/portal/tasks/{task.pk}/").content.decode()
    assert "模拟" in chinese


def test_a_task_that_never_held_a_gpu_says_so_instead_of_a_chart(owner):
    task = TaskFactory(tenant=owner.tenant, owner=owner.user)
    page = browser(owner).get(f"/portal/tasks/{task.pk}/").content.decode()
    assert 'id="gpu-history"' in page and 'id="gpu-charts-data"' not in page


def test_the_task_page_costs_the_same_queries_with_few_or_many_samples(owner, workstation):
    gpus = list(workstation.gpus.order_by("index"))
    few = _running_with_samples(owner.tenant, owner.user, gpus[:1], 3)
    many = _running_with_samples(owner.tenant, owner.user, gpus[1:], 200)
    client = browser(owner)
    assert _queries(client, f"/portal/tasks/{few.pk}/") == _queries(
        client, f"/portal/tasks/{many.pk}/"
    )


def test_another_tenants_task_charts_are_not_found(outsider, owner, workstation):
    gpus = list(workstation.gpus.order_by("index"))[:1]
    task = _running_with_samples(owner.tenant, owner.user, gpus, 3)
    assert browser(outsider).get(f"/portal/tasks/{task.pk}/").status_code == 404


# --- Usage: allocated beside used ----------------------------------------------------------------


def test_usage_shows_used_and_idle_beside_allocated_per_day_and_member(owner, workstation):
    """An hour on one GPU yesterday: busy at 100% for half of it, idle for the other half."""
    from datetime import timedelta

    from django.utils import timezone

    from telemetry.models import GpuRollupMinute
    from tests.factories import AllocationFactory

    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    started = midnight - timedelta(hours=14)
    gpu = workstation.gpus.get(index=0)
    task = TaskFactory(tenant=owner.tenant, owner=owner.user, state="succeeded")
    ended = started + timedelta(hours=1)
    AllocationFactory(task=task, gpu=gpu, started_at=started, released_at=ended, exclusive=True,
                      memory_mb=gpu.memory_mb)  # fmt: skip
    GpuRollupMinute.objects.bulk_create(
        GpuRollupMinute(gpu=gpu, start=started + timedelta(minutes=m), task=task,
                        tenant=owner.tenant, samples=60, util_gpu_mean=100.0 * (m < 30),
                        util_gpu_max=100.0 * (m < 30))
        for m in range(60)
    )  # fmt: skip
    client = browser(owner)
    response = client.get("/portal/usage/")
    day = next(row for row in response.context["per_day"] if row["gpu_hours"])
    assert (day["gpu_hours"], day["used_gpu_hours"], day["idle_gpu_hours"]) == (1.0, 0.5, 0.5)
    member = response.context["per_member"][0]
    assert (member["member"], member["used_gpu_hours"], member["idle_gpu_hours"]) == (
        "alice", 0.5, 0.5,
    )  # fmt: skip
    assert "Used GPU-hours" in response.content.decode()
    lines = client.get("/portal/usage.csv").content.decode().splitlines()
    assert lines[0] == "day,gpu_hours_allocated,gpu_hours_used,gpu_hours_idle_allocated"
    assert f"{day['day'].isoformat()},1.0000,0.5000,0.5000" in lines
    assert "alice,1.0000,0.5000,0.5000" in lines
    # A day with nothing sampled is not measured, not zero.
    assert any(row.endswith(",0.0000,,") for row in lines)
    chinese = browser(owner, language="zh-hans").get("/portal/usage/").content.decode()
    assert "实际使用" in chinese


def test_an_attempt_stopped_by_its_nodes_lease_says_why_in_the_readers_language(owner, bobs_task):
    from scheduling.models import TaskAttempt
    from tests.factories import NodeFactory

    TaskAttempt.objects.create(
        task=bobs_task,
        number=1,
        node=NodeFactory(name="node-a"),
        outcome="lost",
        end_reason={"code": "node_fenced", "params": {"node": "node-a", "seconds": 61}},
    )
    page = browser(owner).get(f"/portal/tasks/{bobs_task.pk}/").content.decode()
    assert "node node-a lost the database for 61 s: the attempt was stopped" in page
    chinese = browser(owner, language="zh-hans").get(f"/portal/tasks/{bobs_task.pk}/")
    assert "节点 node-a 与数据库失联 61 秒：本次运行已被停止" in chinese.content.decode()
