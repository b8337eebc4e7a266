"""Reasons as data: every move stores its reason as a code and parameters beside the English
text (``scheduling.reasons``), and the portal, the API, the dashboard and the admin render it in
the reader's language."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import translation

from gpuplatform.procid import ProcessId
from scheduling import controls, reasons, scheduler
from scheduling.agentapi import reports
from scheduling.agentapi.messages import ExitReport, StartReport
from scheduling.models import Task, TaskAttempt, TaskEvent
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.portal.browser import catalogue

GONE = ProcessId(4_194_303, 0.0)  # no such process: nothing runs


def ran(tenant, owner, node, exit_code: int = 0, name: str = "train") -> Task:
    """A task submitted, placed by a pass, started and ended with ``exit_code`` through the
    statements production uses (the pass's placement, the agent's start and end reports); no
    process runs."""
    task = task_submit(tenant=tenant, owner=owner, spec=TaskSpec(name=name, command="true"))
    scheduler.schedule_pass()
    attempt = TaskAttempt.objects.create(task=task, number=1, node=node, gpu_uuids=[])
    reports.attempts_started([StartReport(attempt.pk, GONE, GONE)])
    reports.attempts_finished([ExitReport(task.pk, 1, exit_code)])
    task.refresh_from_db()
    return task


def browser(actor, language: str = "en") -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(actor.user)
    return client


def trail(task: Task) -> list[tuple[str, str, dict]]:
    return list(
        TaskEvent.objects.filter(task=task)
        .order_by("at", "id")
        .values_list("to_state", "reason_code", "reason_params")
    )


# --- The catalogue -------------------------------------------------------------------------------


def test_every_code_has_its_chinese():
    chinese = catalogue()
    missing = [
        template
        for code, template in reasons.TEMPLATES.items()
        if code != reasons.TEXT
        # A template translated in a context is found under "context\x04template".
        and "\x04".join([*filter(None, [reasons.CONTEXTS.get(code)]), template]) not in chinese
    ]
    assert missing == []


def test_a_reason_with_notes_reads_as_the_english_text_did_and_in_chinese():
    reason = (
        reasons.Reason("exited", {"exit_code": 1})
        .noted("output not kept: disk full")
        .noted(reasons.Reason("retry", {"failure": 1, "retries": 2, "delay": 5}))
    )
    assert reason.text == "exited with 1; output not kept: disk full; retry 1 of 2 in 5 s"
    with translation.override("zh-hans"):
        assert (
            reason.rendered
            == "已退出，退出码 1；output not kept: disk full；5 秒后第 1 次重试（共 2 次）"
        )


def test_a_reason_inside_a_reason_is_rendered_too():
    lost = reasons.Reason("node_silent", {"node": "ws-2"})
    requeued = reasons.Reason("lost_requeued", {"reason": lost.as_data()})
    assert requeued.text == "requeued: node ws-2 stopped heartbeating"
    with translation.override("zh-hans"):
        assert requeued.rendered == "已重新排队：节点 ws-2 停止了心跳"


def test_a_row_without_a_code_or_with_one_unknown_shows_its_stored_text():
    with translation.override("zh-hans"):
        assert reasons.render("", {}, "written before codes") == "written before codes"
        assert reasons.render("from_the_future", {}, "stored") == "stored"
        assert reasons.render("exited", {}, "a parameter missing") == "a parameter missing"


def test_an_unknown_code_or_a_missing_parameter_is_refused_where_a_reason_is_made():
    with pytest.raises(ValueError, match="reason code"):
        reasons.Reason("exited_wiht")
    with pytest.raises(ValueError, match="exit_code"):
        reasons.Reason("exited", {"code": 1})


# --- What the moves store ------------------------------------------------------------------------


def test_submit_place_start_and_end_store_codes_and_keep_the_english_text(owner, workstation):
    task = ran(owner.tenant, owner.user, workstation)
    assert trail(task) == [
        ("pending", "submitted", {}),
        ("scheduled", "placed", {"node": "workstation-1", "gpus": "0"}),
        ("running", "started", {"node": "workstation-1", "pid": GONE.pid}),
        ("succeeded", "exited", {"exit_code": 0}),
    ]
    texts = list(TaskEvent.objects.filter(task=task).order_by("at", "id").values_list("reason"))
    assert texts == [
        ("submitted",),
        ("placed on workstation-1 (GPU 0)",),
        (f"started on workstation-1 (pid {GONE.pid})",),
        ("exited with 0",),
    ]
    assert (task.reason, task.reason_code) == ("exited with 0", "exited")


def test_a_failure_and_a_cancel_by_someone_store_theirs(owner, teammate, workstation):
    failed = ran(owner.tenant, owner.user, workstation, exit_code=2, name="bad")
    assert (failed.state, failed.reason, failed.reason_code) == (
        "failed",
        "exited with 2",
        "exited",
    )
    assert failed.reason_params == {"exit_code": 2}
    waiting = task_submit(
        tenant=owner.tenant, owner=owner.user, spec=TaskSpec(name="w", command="x")
    )
    cancelled = controls.task_cancel(task=waiting, by=teammate.user)
    assert (cancelled.reason, cancelled.reason_code) == ("cancelled by bob", "cancelled_by")
    with translation.override("zh-hans"):
        assert cancelled.reason_text == "已被 bob 取消"


# --- Where people read them ----------------------------------------------------------------------


def test_the_chinese_task_page_shows_each_event_in_chinese(owner, workstation):
    task = ran(owner.tenant, owner.user, workstation)
    page = browser(owner, language="zh-hans").get(f"/portal/tasks/{task.pk}/").content.decode()
    for chinese in ("已提交", "已分配到 workstation-1（GPU 0）", "已在 workstation-1 上启动",
                    "已退出，退出码 0"):  # fmt: skip
        assert chinese in page, chinese
    for english in ("submitted", "placed on", "started on", "exited with"):
        assert english not in page, english
    # The English page still reads as it always did.
    page = browser(owner).get(f"/portal/tasks/{task.pk}/").content.decode()
    assert "placed on workstation-1 (GPU 0)" in page and "exited with 0" in page


def test_the_api_answers_in_the_accept_language_with_the_code_and_params(owner, workstation):
    from rest_framework.test import APIClient

    task = ran(owner.tenant, owner.user, workstation, exit_code=3)
    client = APIClient(HTTP_ACCEPT_LANGUAGE="zh-Hans")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    detail = client.get(f"/api/v1/tasks/{task.pk}/").json()
    assert detail["reason"] == "已退出，退出码 3"
    assert (detail["reason_code"], detail["reason_params"]) == ("exited", {"exit_code": 3})
    [listed] = client.get("/api/v1/tasks/").json()["results"]
    assert (listed["reason"], listed["reason_code"]) == ("已退出，退出码 3", "exited")
    body = client.get(f"/api/v1/tasks/{task.pk}/events/").json()
    events = body["results"] if isinstance(body, dict) else body
    assert [e["reason_code"] for e in events] == ["submitted", "placed", "started", "exited"]
    assert events[1]["reason"] == "已分配到 workstation-1（GPU 0）"
    # Without Accept-Language: English, as API clients always read it.
    english = APIClient()
    english.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    assert english.get(f"/api/v1/tasks/{task.pk}/").json()["reason"] == "exited with 3"


def test_the_chinese_dashboard_and_admin_show_a_chinese_reason(client, owner, workstation):
    from tests.factories import UserFactory

    ran(owner.tenant, owner.user, workstation, exit_code=4)
    task_submit(tenant=owner.tenant, owner=owner.user, spec=TaskSpec(name="next", command="x"))
    client.force_login(UserFactory(username="olga", is_staff=True, is_superuser=True))
    page = client.get("/dashboard/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "已提交；等待调度器" in page  # the queue's "why it waits", before a pass looked
    assert "waiting for the scheduler" not in page
    admin = client.get("/admin/scheduling/taskevent/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "已退出，退出码 4" in admin.content.decode()


def test_a_broken_gpus_state_reads_as_its_state_does_everywhere():
    state = reasons.Reason("gpu_state_failed").as_data()
    reason = reasons.Reason("gpu_broken", {"gpu": "workstation-1 GPU 0", "state": state,
                                           "exit_code": 1})  # fmt: skip
    assert reason.text == "GPU workstation-1 GPU 0 became failed during the attempt (exit 1)"
    with translation.override("zh-hans"):
        assert "故障" in reason.rendered and "failed" not in reason.rendered
