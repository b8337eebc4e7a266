"""The scheduling service end to end against PostgreSQL: submit, pass, placements, reasons."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone, translation

from scheduling import passes, scheduler, services, snapshot, transitions
from scheduling.agentapi import reports
from scheduling.models import Allocation, PassRequest, SchedulerState, Task, TaskAttempt, TaskEvent
from scheduling.spec import TaskSpec
from scheduling.states import TaskState
from scheduling.submission import SubmitError, task_submit, tasks_submit
from tenants.models import Quota
from tests.factories import NodeFactory, TenantFactory, make_gpus


def spec(name: str = "train", **kwargs) -> TaskSpec:
    return TaskSpec(name=name, command="python train.py", **kwargs)


def submit(tenant, name: str = "train", **kwargs) -> Task:
    return task_submit(tenant=tenant, spec=spec(name, **kwargs))


def run(task: Task, to: str = TaskState.RUNNING) -> Task:
    task.refresh_from_db()
    return transitions.task_transition(task=task, to_state=to)


def finish(task: Task, to: str = TaskState.SUCCEEDED) -> Task:
    task.refresh_from_db()
    if task.state == TaskState.SCHEDULED:
        run(task)
    return transitions.task_transition(task=task, to_state=to)


def state(task: Task) -> str:
    task.refresh_from_db()
    return task.state


@pytest.fixture
def other_lab(db):
    return TenantFactory(name="nlp-lab")


# --- Placement -----------------------------------------------------------------------------------


def test_a_submitted_task_is_placed_with_its_allocation_and_an_event(lab, workstation):
    task = submit(lab, gpus_min=2, gpus_max=2)
    result = scheduler.schedule_pass()
    task.refresh_from_db()
    assert result.placed == [task.pk]
    assert (task.state, task.node, task.attempt) == (TaskState.SCHEDULED, workstation, 1)
    allocations = Allocation.objects.filter(task=task, released_at__isnull=True)
    assert allocations.count() == 2
    assert {a.memory_mb for a in allocations} == {24576}
    assert task.events.last().reason.startswith("placed on workstation-1")


def test_the_placement_event_names_gpus_by_their_index_on_the_node(lab, db):
    """Pages and nvidia-smi name a GPU by its index; the event did by its database id."""
    first = NodeFactory(name="workstation-1")
    make_gpus(first, count=4)
    second = NodeFactory(name="workstation-2")  # its GPUs' ids are 5-8, their indexes 0-3
    make_gpus(second, count=4)
    first.gpus.all().delete()
    task = submit(lab, gpus_min=2, gpus_max=2)
    scheduler.schedule_pass()
    assert task.events.last().reason == "placed on workstation-2 (GPU 0, 1)"


def test_two_tenants_submitting_at_the_same_instant_get_two_different_gpus(
    lab, other_lab, workstation
):
    node = NodeFactory(name="duo")
    workstation.gpus.update(state="draining")
    make_gpus(node, count=2)
    a, b = submit(lab), submit(other_lab)
    Task.objects.filter(pk__in=[a.pk, b.pk]).update(submitted_at=timezone.now())
    scheduler.schedule_pass()
    assert state(a) == state(b) == TaskState.SCHEDULED
    gpu_a = Allocation.objects.get(task=a).gpu_id
    gpu_b = Allocation.objects.get(task=b).gpu_id
    assert gpu_a != gpu_b


def test_shared_tasks_share_a_card_and_exclusive_ones_do_not(lab, workstation):
    shared = [submit(lab, f"s{i}", gpu_memory_mb=10 * 1024) for i in range(2)]
    scheduler.schedule_pass()
    gpus = {Allocation.objects.get(task=t).gpu_id for t in shared}
    assert len(gpus) == 1  # both on one card, best fit


# --- Waiting, with a reason ----------------------------------------------------------------------


def test_a_waiting_task_says_why_and_where_it_stands(lab, workstation):
    Quota.objects.create(tenant=lab, max_gpus=2)
    tasks = [submit(lab, f"t{i}") for i in range(3)]
    scheduler.schedule_pass()
    waiting = tasks[2]
    waiting.refresh_from_db()
    assert waiting.state == TaskState.PENDING
    assert waiting.reason == "tenant vision-lab has no room left in its quota of 2 GPUs"
    assert (
        waiting.reason_text
        == "tenant vision-lab has no room left in its quota of 2 GPUs; 1st of 1 in line"
    )


def test_why_a_task_waits_is_stored_as_data_the_reason_is_rendered_from(lab, workstation):
    Quota.objects.create(tenant=lab, max_gpus=3)
    placed = [submit(lab, f"t{i}") for i in range(3)]
    over_quota = submit(lab, "fourth")
    queued = [submit(lab, f"q{i}", queue="sft") for i in range(2)]
    scheduler.schedule_pass()
    for task in (over_quota, *queued):
        task.refresh_from_db()
    details = {"limit": "gpus", "of": 3, "pool": None, "tenant": "vision-lab"}
    # Stored without the place in line, which is the pass's line (SchedulerState.line).
    assert over_quota.wait == {"code": "quota", "details": details}
    assert over_quota.wait_view == {"code": "quota", "position": 1, "line": 2, "details": details}
    assert (
        over_quota.reason_text
        == "tenant vision-lab has no room left in its quota of 3 GPUs; 1st of 2 in line"
    )
    # ... and as a reason of the catalogue, which each reader reads in their language.
    assert over_quota.reason_code == "wait_quota_gpus"
    with translation.override("zh-hans"):
        assert (
            over_quota.reason_text
            == "租户 vision-lab 的配额（3 块 GPU）已无余量；排队第 1 位，共 2 位"
        )
    # The head of the serial queue is second in line; the next one waits behind it, out of line.
    assert queued[1].wait_view == {
        "code": "queue",
        "position": None,
        "line": None,
        "details": {"queue": "sft", "behind": queued[0].pk, "running": False},
    }
    # Leaving pending clears it; the next pass writes a fresh one.
    finish(placed[0])
    over_quota.refresh_from_db()
    assert over_quota.wait_view["position"] == 1
    scheduler.schedule_pass()
    over_quota.refresh_from_db()
    assert (over_quota.state, over_quota.wait, over_quota.reason) == ("scheduled", {}, "")
    assert over_quota.wait_view is None


def test_a_pass_writes_every_reason_and_its_data_in_one_statement(lab, workstation):
    """However many tasks wait, the pass costs the same queries (no per-task writes), and it
    rewrites only the reasons that changed."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def pass_queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            scheduler.schedule_pass()
        return len(captured)

    submit(lab, "all", gpus_min=4, gpus_max=4)
    submit(lab, "first-waiting", gpus_min=4, gpus_max=4)
    scheduler.schedule_pass()  # places the first; the rest is what every later pass does
    few = pass_queries()
    for i in range(30):
        submit(lab, f"more-{i}", gpus_min=4, gpus_max=4)
    assert pass_queries() == few
    waiting = list(Task.objects.filter(state=TaskState.PENDING))
    Task.attach_places(waiting)
    assert sorted(t.place[0] for t in waiting) == list(range(1, 32))
    assert {t.wait["code"] for t in waiting} == {"capacity", "reserved"}

    # Nothing changed: the next pass writes no task at all (their places are in one array).
    with CaptureQueriesContext(connection) as captured:
        scheduler.schedule_pass()
    writes = [q["sql"] for q in captured if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert not any("scheduling_task" in sql for sql in writes), writes
    # One more task changes its own reason only; the others keep theirs and move in line.
    Task.objects.filter(pk=waiting[-1].pk).update(priority=50)
    with CaptureQueriesContext(connection) as captured:
        scheduler.schedule_pass()
    assert any("scheduling_task" in q["sql"] and "wait_digest" in q["sql"] for q in captured)


def test_a_tenants_waiting_tasks_are_not_rewritten_when_what_it_uses_moves(lab, workstation):
    """A tenant at its quota waits with the same reason whatever it uses below the limit: a
    shared task that ends moves its use by a fraction, and a reason that said the figure was
    written again to every one of its waiting tasks at the next pass, each row locked against
    the agents' hand-offs until the pass committed."""
    Quota.objects.create(tenant=lab, max_gpus=2)
    whole = submit(lab, "whole")
    shared = [submit(lab, f"shared-{i}", gpu_memory_mb=4 * 1024) for i in range(2)]
    scheduler.schedule_pass()
    assert {state(t) for t in (whole, *shared)} == {"scheduled"}
    waiting = [submit(lab, f"waiting-{i}") for i in range(20)]
    scheduler.schedule_pass()  # writes their reason: 1 + 2 x 1/6 in use, and 1 more asked
    finish(shared[0])  # 1 + 1/6 in use: still no room for a whole GPU
    with CaptureQueriesContext(connection) as captured:
        scheduler.schedule_pass()
    rewrites = [q["sql"] for q in captured if "UPDATE scheduling_task" in q["sql"]]
    assert not [sql for sql in rewrites if "wait_digest" in sql]
    assert {state(t) for t in waiting} == {"pending"}
    reason = Task.objects.get(pk=waiting[0].pk).reason
    assert reason == "tenant vision-lab has no room left in its quota of 2 GPUs"


def test_a_serial_queue_of_three_runs_one_at_a_time_in_order(lab, workstation):
    q = [submit(lab, f"step{i}", queue="sft") for i in range(3)]
    scheduler.schedule_pass()
    assert [state(t) for t in q] == ["scheduled", "pending", "pending"]
    finish(q[0])
    scheduler.schedule_pass()
    assert [state(t) for t in q] == ["succeeded", "scheduled", "pending"]
    q[2].refresh_from_db()
    assert f"queue sft: waiting behind #{q[1].pk}" in q[2].reason
    finish(q[1], TaskState.FAILED)
    scheduler.schedule_pass()
    assert state(q[2]) == TaskState.SCHEDULED


def test_a_blocked_eight_gpu_task_starts_while_small_tasks_keep_arriving(lab, other_lab):
    node = NodeFactory(name="big")
    make_gpus(node, count=8)
    smalls = [submit(other_lab, f"warm{i}", timeout_s=3600) for i in range(4)]
    scheduler.schedule_pass()
    big = submit(lab, "big", gpus_min=8, gpus_max=8)
    for round_ in range(4):
        # A new unbounded 1-GPU task arrives every round; the running ones end one by one.
        submit(other_lab, f"late{round_}")
        scheduler.schedule_pass()
        finish(smalls[round_])
    scheduler.schedule_pass()
    assert state(big) == TaskState.SCHEDULED
    late = Task.objects.filter(name__startswith="late")
    assert all(t.state == TaskState.PENDING for t in late)


def test_dependencies_wait_then_run_or_fail_with_the_reason(lab, workstation):
    prep = submit(lab, "prep")
    train = task_submit(tenant=lab, spec=spec("train", after=("prep",)))
    scheduler.schedule_pass()
    train.refresh_from_db()
    assert train.state == TaskState.PENDING
    assert f"waiting for prep (#{prep.pk}, pending)" in train.reason  # as the pass began
    scheduler.schedule_pass()
    train.refresh_from_db()
    assert f"waiting for prep (#{prep.pk}, scheduled)" in train.reason
    finish(prep)
    scheduler.schedule_pass()
    assert state(train) == TaskState.SCHEDULED

    broken = submit(lab, "broken")
    after_broken = task_submit(tenant=lab, spec=spec("eval", after=(broken.pk,)))
    scheduler.schedule_pass()
    finish(broken, TaskState.FAILED)
    scheduler.schedule_pass()
    after_broken.refresh_from_db()
    assert after_broken.state == TaskState.FAILED
    assert after_broken.reason == f"dependency broken (#{broken.pk}) failed"


def test_a_pass_reads_dependencies_once_and_a_chain_sees_what_it_failed(lab, workstation):
    broken = submit(lab, "broken")
    scheduler.schedule_pass()
    evaluate = task_submit(tenant=lab, spec=spec("eval", after=(broken.pk,)))
    report = task_submit(tenant=lab, spec=spec("report", after=(evaluate.pk,)))
    finish(broken, TaskState.FAILED)
    with CaptureQueriesContext(connection) as seen:
        result = scheduler.schedule_pass()
    assert result.failed == [evaluate.pk]
    reads = [q for q in seen.captured_queries if "scheduling_task_depends_on" in q["sql"]]
    assert len(reads) == 1
    # The pass failed its dependency: the next one waits on it as failed, and fails next pass.
    report.refresh_from_db()
    assert report.state == TaskState.PENDING
    assert f"waiting for eval (#{evaluate.pk}, failed)" in report.reason
    scheduler.schedule_pass()
    report.refresh_from_db()
    assert report.state == TaskState.FAILED
    assert report.reason == f"dependency eval (#{evaluate.pk}) failed"


def test_a_pass_takes_its_lock_and_reads_everything_in_one_round_trip(
    lab, workstation, monkeypatch
):
    submit(lab, "first", gpus_min=4, gpus_max=4)
    scheduler.schedule_pass()  # keeps the fair-share counters: later passes need no rebuild
    sent: list[list[str]] = []
    fetch_together = scheduler.fetch_together

    def recorded(*queries, **kwargs):
        sent.append([query.sql for query in queries])
        return fetch_together(*queries, **kwargs)

    monkeypatch.setattr(scheduler, "fetch_together", recorded)
    monkeypatch.setattr(scheduler.fairshare, "fetch_together", recorded)
    waiting = submit(lab, "second", gpus_min=4, gpus_max=4)
    assert scheduler.schedule_pass().waiting == 1
    (reads,) = sent  # one round trip: no read of the pass goes alone
    assert "pg_advisory_xact_lock" in reads[0]  # first: each read sees the previous pass's work
    assert any("scheduling_task_depends_on" in sql for sql in reads)
    assert any("tenants_quota" in sql for sql in reads)
    waiting.refresh_from_db()
    assert waiting.wait["code"] == "reserved"  # behind the first, which holds all four GPUs


def test_dependencies_inside_one_batch_resolve_by_name(lab, workstation):
    first, second = tasks_submit(tenant=lab, specs=[spec("prep"), spec("train", after=("prep",))])
    assert list(second.depends_on.all()) == [first]


# --- Preemption ----------------------------------------------------------------------------------


def test_a_preemption_requeues_its_victim_and_the_urgent_task_starts(lab, other_lab):
    node = NodeFactory(name="solo")
    make_gpus(node, count=1)
    victim = submit(other_lab, "background", priority=10)
    scheduler.schedule_pass()
    run(victim)
    TaskAttempt.objects.create(task=victim, number=1, node=node)  # as the launcher would
    urgent = submit(lab, "urgent", priority=90)
    result = scheduler.schedule_pass()
    assert result.preempted == [victim.pk]
    victim.refresh_from_db()
    assert victim.state == TaskState.PREEMPTED
    assert f"preempted for #{urgent.pk}" in victim.reason
    # Its GPU stays held until its processes have stopped (the launcher's job).
    assert Allocation.objects.filter(task=victim, released_at__isnull=True).exists()
    scheduler.schedule_pass()
    assert state(urgent) == TaskState.PENDING

    assert reports.attempt_finished(victim.pk, 1, 143) == "preempted"  # the supervisor reports
    scheduler.schedule_pass()
    assert state(urgent) == TaskState.SCHEDULED
    victim.refresh_from_db()
    assert victim.state == TaskState.PENDING  # requeued, not failed
    assert list(victim.events.values_list("to_state", flat=True)) == [
        "pending", "scheduled", "running", "preempted", "pending",
    ]  # fmt: skip


# --- Rejected at submission ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpus_min": 5, "gpus_max": 5}, "resources.gpus", "largest matching node has 4"),
        ({"gpu_memory_mb": 30 * 1024}, "resources.gpu_memory", "largest matching GPU has 24 GiB"),
        ({"pool": "nowhere"}, "resources.pool", "unknown pool 'nowhere'"),
        ({"gpu_type": "h100-80g"}, "resources.gpu_type", "no GPU of type 'h100-80g'"),
        ({"node": "ghost"}, "resources.node", "unknown node 'ghost'"),
    ],
)
def test_it_refuses_what_no_gpu_could_ever_satisfy(lab, workstation, fields, field, words):
    with pytest.raises(SubmitError) as refused:
        submit(lab, **fields)
    assert words in " ".join(refused.value.errors[field])
    assert not Task.objects.exists()


def test_it_refuses_a_priority_above_the_quota_and_too_many_queued(lab, workstation):
    Quota.objects.create(tenant=lab, max_priority=50, max_queued_tasks=2)
    with pytest.raises(SubmitError) as refused:
        submit(lab, priority=90)
    assert "above this tenant's highest allowed, 50" in refused.value.errors["priority"][0]
    submit(lab, "a")
    submit(lab, "b")
    with pytest.raises(SubmitError) as refused:
        submit(lab, "c")
    assert "at most 2 tasks queued" in refused.value.errors["quota"][0]


def test_a_bad_document_refuses_the_whole_batch_naming_it(lab, workstation):
    with pytest.raises(SubmitError) as refused:
        tasks_submit(tenant=lab, specs=[spec("ok"), spec("bad", gpus_min=9, gpus_max=9)])
    assert "[1].resources.gpus" in refused.value.errors
    assert not Task.objects.exists()


def test_after_never_reveals_another_tenants_task(lab, other_lab, workstation):
    foreign = submit(other_lab, "secret")
    with pytest.raises(SubmitError) as refused:
        task_submit(tenant=lab, spec=spec("x", after=(foreign.pk,)))
    assert refused.value.errors["policy.after"] == [f"no task #{foreign.pk} in this tenant"]


def test_an_inactive_tenant_cannot_submit(lab, workstation):
    lab.is_active = False
    lab.save()
    with pytest.raises(SubmitError):
        submit(lab)


# --- Coalescing and fair share -------------------------------------------------------------------


def test_a_burst_of_submissions_queues_one_pass(lab, workstation, monkeypatch,
                                                django_capture_on_commit_callbacks):  # fmt: skip
    queued = []
    monkeypatch.setattr(passes, "async_task", lambda *a, **k: queued.append(a))
    PassRequest.objects.update_or_create(pk=1, defaults={"queued": False})
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(200):
            submit(lab, f"t{i}")
    assert len(queued) == 1
    # Once the pass starts, the next request queues another: nothing is missed.
    passes.mark_started()
    with django_capture_on_commit_callbacks(execute=True):
        submit(lab, "late")
    assert len(queued) == 2


def test_recent_usage_decays_with_the_half_life(lab, workstation):
    task = submit(lab)
    scheduler.schedule_pass()
    now = timezone.now()
    half_life = 3600
    Allocation.objects.filter(task=task).update(
        started_at=now - timedelta(seconds=2 * half_life),
        released_at=now - timedelta(seconds=half_life),
    )
    usage = snapshot.recent_gpus(now, half_life)
    # 2^-1 - 2^-2 = 0.25 GPUs: an hour of one GPU that ended an hour ago.
    assert usage[lab.pk] == pytest.approx(0.25)


def test_the_pass_records_how_it_went(lab, workstation):
    submit(lab)
    scheduler.schedule_pass()
    row = SchedulerState.objects.get(pk=1)
    assert row.passes >= 1
    assert row.last_placed == 1
    assert row.last_pass_ms > 0
    assert row.last_pass_ms == round(row.last_pass_ms, 1)  # never 193.39962000003652


def test_drained_gpus_and_silent_nodes_get_no_work(lab, workstation):
    services.nodes_drain(nodes=[workstation])
    task = submit(lab)
    scheduler.schedule_pass()
    assert state(task) == TaskState.PENDING
    services.nodes_undrain(nodes=[workstation])
    scheduler.schedule_pass()
    assert state(task) == TaskState.SCHEDULED
    assert TaskEvent.objects.filter(task=task, to_state="scheduled").count() == 1


def test_a_batch_costs_the_same_statements_however_many_tasks_it_holds(lab, workstation):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(count: int) -> int:
        specs = [spec(f"s{count}-{i}", pool="default") for i in range(count)]
        with CaptureQueriesContext(connection) as captured:
            tasks_submit(tenant=lab, specs=specs)
        return len(captured)

    # The estate is read once, and the tasks and their events are inserted in one statement
    # each (the quota's queue cap is absent here: no lock, no count).
    assert queries(1) == queries(10) == queries(100)


def test_a_reason_written_before_it_had_a_code_is_written_again_with_it(lab, workstation):
    import json

    Quota.objects.create(tenant=lab, max_gpus=1)
    submit(lab, "runs")
    task = submit(lab, "waits")
    scheduler.schedule_pass()
    task.refresh_from_db()
    code = task.reason_code
    # As a pass before the codes left it: the same text and wait, no code, its digest of both.
    record = json.dumps(task.wait, sort_keys=True)
    Task.objects.filter(pk=task.pk).update(
        reason_code="", reason_params={}, wait_digest=scheduler._digest(task.reason, record)
    )
    scheduler.schedule_pass()
    task.refresh_from_db()
    assert (task.reason_code, code) == ("wait_quota_gpus", "wait_quota_gpus")
    with translation.override("zh-hans"):
        assert task.reason_text.startswith("租户 vision-lab 的配额（1 块 GPU）已无余量")
