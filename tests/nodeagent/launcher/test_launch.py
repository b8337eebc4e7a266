"""Launching for real: the supervisor runs the command, logs it, and records how it ended."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from nodeagent.launcher import lifecycle, procs
from scheduling import controls, estate, passes, paths, scheduler
from scheduling.agentapi.messages import Assignment
from scheduling.models import Task, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import SubmitError, task_submit, tasks_submit
from tests.factories import UserFactory
from tests.nodeagent.launcher.conftest import rewind, state_of, wait_for


def start(lab, command: str, name: str = "t", **fields) -> Task:
    task = task_submit(tenant=lab, spec=TaskSpec(name=name, command=command, **fields))
    scheduler.schedule_pass()
    return task


def attempt_of(task: Task, number: int = 1) -> TaskAttempt:
    return TaskAttempt.objects.get(task=task, number=number)


def log_of(task: Task, number: int = 1) -> str:
    return Path(attempt_of(task, number).log_path).read_text()


def running(task: Task) -> TaskAttempt:
    wait_for(state_of(task, "running"))
    return attempt_of(task, task.attempt)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- Running and recording -------------------------------------------------------------------


def test_a_task_runs_with_its_gpus_and_its_output_is_logged(launcher, node, lab):
    task = start(lab, 'echo "gpus=$CUDA_VISIBLE_DEVICES id=$GPUPLATFORM_TASK_ID"; pwd; exit 3')
    wait_for(state_of(task, "failed"))
    assert task.exit_code == 3
    uuid = node.gpus.get(index=0).uuid
    log = log_of(task)
    assert f"gpus={uuid} id={task.pk}" in log
    assert str(launcher / "tasks" / "vision-lab") in log
    assert attempt_of(task).outcome == "failed"
    assert task.reason == "exited with 3"


def test_an_attempt_s_log_holds_only_its_own_output(launcher, node, lab):
    # A file already at the path (a database reset, task ids counted again) is not shown as
    # the new task's output: it may be another installation's tenant of the same name.
    first = task_submit(tenant=lab, spec=TaskSpec(name="first", command="sleep 1"))
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command="echo new", after=(first.pk,)))
    stale = paths.log_path(lab.name, task.pk, 1)  # written while the task waits for the first
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier installation's task 1\n")
    wait_for(state_of(task, "succeeded"))
    assert log_of(task) == "new\n"


def backend_pid() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_forking_a_supervisor_keeps_the_launchers_own_database_session(launcher, node, lab):
    """The launcher forks a supervisor per task. It used to close its session first (a new
    PostgreSQL backend per task); the child opens its own and never touches the parent's."""
    before = backend_pid()
    task = start(lab, "true")
    wait_for(state_of(task, "succeeded"))
    assert backend_pid() == before
    assert attempt_of(task).supervisor_pid is not None


@pytest.mark.parametrize(("command", "state", "code"), [
    ("true", "succeeded", 0),
    ("exit 3", "failed", 3),
    ("kill -9 $$", "failed", 137),
])  # fmt: skip
def test_exit_codes_are_recorded(launcher, node, lab, command, state, code):
    task = start(lab, command)
    wait_for(state_of(task, state))
    assert task.exit_code == code
    assert task.allocations.filter(released_at__isnull=True).count() == 0


def test_the_platforms_secrets_never_reach_the_task(launcher, node, lab, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "s3cret-platform-key")
    task = start(lab, "env", env={"MY_SETTING": "yes"})
    wait_for(state_of(task, "succeeded"))
    log = log_of(task)
    assert "MY_SETTING=yes" in log
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in log
    assert "GPUPLATFORM_ATTEMPT=1" in log
    for secret in ("DATABASE_URL", "SECRET_KEY", "s3cret-platform-key", "DJANGO_SETTINGS"):
        assert secret not in log


def test_ps_shows_a_supervisor_by_its_task_and_attempt(launcher, node, lab):
    task = start(lab, "sleep 300")
    attempt = running(task)
    pid = wait_for(lambda: attempt_of(task).supervisor_pid)

    title = f"gpup-supervisor task={task.pk} attempt=1"
    # what ps -o args (and top, htop) show: the full command line, not python manage.py ...
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
    assert cmdline.decode() == title == procs.title_of(pid) == procs.supervisor_title(task.pk, 1)
    assert Path(f"/proc/{pid}/comm").read_text() == "gpup-supervisor\n"  # and top's name
    controls.task_cancel(task=task)
    wait_for(state_of(task, "cancelled"))
    assert gone(attempt.pid)


def test_a_workdir_leading_out_of_the_tenant_root_is_refused(launcher, node, lab):
    root = launcher / "tasks" / "vision-lab"
    root.mkdir(parents=True)
    (root / "escape").symlink_to("/etc")
    with pytest.raises(SubmitError) as refused:
        task_submit(tenant=lab, spec=TaskSpec(name="x", command="ls", workdir="escape"))
    assert "outside the tenant's directory" in refused.value.errors["workdir"][0]


def test_a_workdir_that_is_a_loop_of_symbolic_links_is_refused_with_its_reason(launcher, node, lab):
    root = launcher / "tasks" / "vision-lab"
    root.mkdir(parents=True)
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with pytest.raises(SubmitError) as refused:
        task_submit(tenant=lab, spec=TaskSpec(name="x", command="ls", workdir="a/data"))
    assert refused.value.errors["workdir"] == ["'a/data' is a loop of symbolic links"]


def test_a_user_failure_is_retried_then_fails_for_good(launcher, node, lab):
    task = start(lab, "exit 3", retries=1)
    wait_for(state_of(task, "failed"))
    assert [a.outcome for a in task.attempts.order_by("number")] == ["failed", "failed"]
    reasons = list(task.events.values_list("reason", flat=True))
    assert "exited with 3; retry 1 of 1 in 0 s" in reasons
    assert reasons[-1] == "exited with 3"


def test_a_long_task_is_started_exactly_once_however_often_the_launch_arrives(
    launcher, node, lab, monkeypatch
):
    # Hold the first delivery back so several arrive together, like django-q2 re-deliveries.
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    marker = launcher / "tasks" / "vision-lab" / "starts"
    task = start(lab, f"echo started >> {marker}; sleep 2")
    results = []

    def deliver():
        results.append(lifecycle.launch(task.pk, 1))
        connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.append(lifecycle.launch(task.pk, 1))  # and once more, late
    wait_for(state_of(task, "succeeded"))
    assert sorted(results).count("launched") == 1
    assert marker.read_text() == "started\n"
    assert TaskAttempt.objects.filter(task=task).count() == 1


# --- Cancel, timeout, pause ------------------------------------------------------------------


STUBBORN = (
    "trap '' TERM; setsid sh -c 'trap \"\" TERM; sleep 300' & echo $! > {pidfile}; "
    "while true; do sleep 0.1; done"
)


def task_processes(task_id: int) -> list[psutil.Process]:
    """The live processes of a task, found by the marker in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GPUPLATFORM_TASK_ID") == str(task_id) and not gone(proc.pid):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def host_pid(task_id: int, pid: int) -> int:
    """The host's pid of a process of the task that the task knows as ``pid`` (in its own PID
    namespace, where it has one: the last of /proc/<pid>/status's NSpid)."""

    def find():
        for proc in task_processes(task_id):
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{proc.pid}/status").read_text()
                nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
                if int(nspid.split()[-1]) == pid:
                    return proc.pid
        return None

    find.__doc__ = f"the host pid of task {task_id}'s pid {pid}"
    return wait_for(find)


def test_cancel_leaves_nothing_behind_even_a_stubborn_setsid_grandchild(launcher, node, lab):
    pidfile = launcher / "tasks" / "vision-lab" / "grandchild.pid"
    task = start(lab, STUBBORN.format(pidfile=pidfile))
    attempt = running(task)
    seen = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))
    grandchild = host_pid(task.pk, seen)
    assert not gone(grandchild)
    cancelling = controls.task_cancel(task=task, by=UserFactory(username="alice"))
    assert (cancelling.state, cancelling.reason) == ("running", "cancelled by alice; stopping")
    wait_for(state_of(task, "cancelled"))
    # stopped now: the reason no longer says it is stopping
    assert task.reason == "cancelled by alice"
    assert task.events.order_by("id").last().reason == "cancelled by alice"
    assert gone(attempt.pid)
    assert gone(grandchild)
    wait_for(lambda: gone(attempt.supervisor_pid))


def test_a_timeout_stops_the_task_and_its_descendants(launcher, node, lab):
    pidfile = launcher / "tasks" / "vision-lab" / "grandchild.pid"
    task = start(lab, STUBBORN.format(pidfile=pidfile), timeout_s=1)
    wait_for(state_of(task, "timed_out"))
    assert task.reason == "timed out after 1 s"
    assert pidfile.read_text().strip()  # the grandchild was there
    assert not task_processes(task.pk)


def test_pause_stops_output_and_resume_continues_it(launcher, node, lab):
    task = start(lab, "i=0; while true; do i=$((i+1)); echo $i; sleep 0.02; done")
    attempt = running(task)
    log = Path(attempt.log_path)
    wait_for(lambda: log.stat().st_size > 0)
    controls.task_pause(task=task)
    time.sleep(0.5)  # let the pause land
    size = log.stat().st_size
    time.sleep(0.5)
    assert log.stat().st_size == size
    task.refresh_from_db()
    controls.task_resume(task=task)
    wait_for(lambda: log.stat().st_size > size)
    controls.task_cancel(task=task)
    wait_for(state_of(task, "cancelled"))


def test_cancelling_a_task_not_yet_launched_needs_no_process(launcher, node, lab, monkeypatch):
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    task = start(lab, "sleep 60")
    controls.task_cancel(task=task)
    task.refresh_from_db()
    assert task.state == "cancelled"
    assert lifecycle.launch(task.pk, 1).startswith("stale")


# --- Preemption and lost nodes ---------------------------------------------------------------


def test_a_preempted_task_is_stopped_and_requeued(launcher, node, lab):
    node.gpus.exclude(index=0).update(state="draining")
    victim = start(lab, "sleep 300", name="background", priority=10)
    attempt = running(victim)
    urgent = start(lab, "true", name="urgent", priority=90)
    wait_for(state_of(victim, "pending", "scheduled", "running"))
    wait_for(lambda: gone(attempt.pid))
    requeue = victim.events.get(from_state="preempted")
    assert (requeue.to_state, requeue.reason) == ("pending", "requeued after preemption")
    assert attempt_of(victim).outcome == "preempted"
    scheduler.schedule_pass()
    wait_for(state_of(urgent, "succeeded"))


def test_a_task_of_a_silent_node_is_lost_requeued_and_its_process_fenced(launcher, node, lab):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling import services

    task = start(lab, "sleep 300")
    attempt = running(task)
    type(node).objects.filter(pk=node.pk).update(
        last_heartbeat=timezone.now() - timedelta(minutes=5)
    )
    services.nodes_mark_silent(offline_after=timedelta(seconds=30))
    lost = controls.requeue_tasks_of_silent_nodes(timedelta(seconds=60))
    assert lost == [task.pk]
    task.refresh_from_db()
    assert task.state == "pending"
    assert task.infra_requeues == 1
    assert attempt_of(task).outcome == "lost"
    # The old supervisor notices it was superseded and stops the process: never twice at once.
    wait_for(lambda: gone(attempt.pid), timeout=15)


def test_reconciliation_finishes_an_attempt_from_its_exit_file(launcher, node, lab):
    task = start(lab, "exit 4")
    wait_for(state_of(task, "failed"))
    attempt = attempt_of(task)
    wait_for(lambda: gone(attempt.supervisor_pid))
    # As if the supervisor had written its exit file but the database never heard of it:
    TaskAttempt.objects.filter(pk=attempt.pk).update(outcome="", exit_code=None)
    rewind(task, state="running", exit_code=None)
    counts = lifecycle.reconcile_node(node.name)
    assert counts["finished"] == 1
    task.refresh_from_db()
    assert (task.state, task.exit_code) == ("failed", 4)


def test_an_exit_file_before_the_start_is_recorded_waits_for_the_supervisor(launcher, node, lab):
    """A command over at once has its start reported with its end, after its exit file: while
    its supervisor may still report, reconciliation leaves it; after LAUNCH_PATIENCE the file
    settles it, the task having run."""
    task = start(lab, "true")
    wait_for(state_of(task, "succeeded"))
    attempt = attempt_of(task)
    wait_for(lambda: gone(attempt.supervisor_pid))
    # As if the supervisor had written its exit file and died before its report:
    TaskAttempt.objects.filter(pk=attempt.pk).update(
        outcome="", exit_code=None, supervisor_pid=None, pid=None
    )
    rewind(task, state="scheduled", exit_code=None)
    assert lifecycle.reconcile_node(node.name)["finished"] == 0
    task.refresh_from_db()
    assert task.state == "scheduled"

    TaskAttempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - lifecycle.LAUNCH_PATIENCE - timedelta(seconds=1)
    )
    assert lifecycle.reconcile_node(node.name)["finished"] == 1
    task.refresh_from_db()
    assert (task.state, task.exit_code) == ("succeeded", 0)
    moves = list(task.events.order_by("pk").values_list("from_state", "to_state"))
    assert moves[-2:] == [("scheduled", "running"), ("running", "succeeded")]


def test_reconciliation_requeues_an_attempt_whose_supervisor_died(launcher, node, lab):
    task = start(lab, "sleep 300")
    attempt = running(task)
    os.kill(attempt.supervisor_pid, 9)
    wait_for(lambda: gone(attempt.supervisor_pid))
    counts = lifecycle.reconcile_node(node.name)
    assert counts["lost"] == 1
    requeue = task.events.get(from_state="lost")
    assert requeue.to_state == "pending"
    assert "supervisor of attempt 1 on workstation-1 is gone" in requeue.reason
    assert "the task's output pipe went with it" in requeue.reason  # why not adopted
    assert attempt_of(task).outcome == "lost"
    task.refresh_from_db()
    assert task.infra_requeues == 1 and task.attempt == 2  # placed again at once
    os.kill(attempt.pid, 9)  # the orphan (its supervisor is dead, nobody else will)


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_tasks_run_as_the_unix_user_an_operator_set(launcher, node, lab):
    lab.unix_user = "nobody"
    lab.save()
    task = start(lab, "id -un")
    wait_for(state_of(task, "succeeded"))
    assert log_of(task).strip() == "nobody"


def test_a_task_whose_gpu_fails_under_it_is_requeued_not_failed(launcher, node, lab):
    task = start(lab, "sleep 1; exit 1")
    attempt = running(task)
    type(node.gpus.first()).objects.filter(uuid__in=attempt.gpu_uuids).update(
        state="failed", state_reason="XID 79: fallen off the bus"
    )
    wait_for(lambda: attempt_of(task).outcome)
    assert attempt_of(task).outcome == "lost"
    requeue = task.events.get(from_state="lost")
    assert "became failed during the attempt (exit 1)" in requeue.reason
    task.refresh_from_db()
    assert task.infra_requeues == 1
    assert task.retries == 0 and task.state in ("pending", "scheduled", "running")


def test_a_pass_queues_its_launches_per_node_and_a_launch_takes_one_statement(
    node, lab, monkeypatch, settings, tmp_path
):
    """No process starts here: what the pass hands the node, and what the launch reads and
    records."""
    settings.LAUNCH_TASKS = True
    settings.TASK_LOG_DIR = str(tmp_path / "logs")
    monkeypatch.delenv("Q_CLUSTER_NAME", raising=False)
    queued = []
    monkeypatch.setattr(controls, "async_task", lambda *args, **kw: queued.append((args, kw)))
    spawned = []
    monkeypatch.setattr(lifecycle, "spawn_supervisor", lambda a, **_: spawned.append(a))
    specs = [TaskSpec(name=f"t{i}", command="true", gpus_min=2, gpus_max=2) for i in range(2)]
    tasks = tasks_submit(tenant=lab, specs=specs)  # one pass places both (sync in tests)

    # One job for the node, from what the pass wrote (no query of its own after the commit).
    assert [(args, kw["cluster"], kw["broker"].list_key) for args, kw in queued] == [
        (("nodeagent.launcher.tasks.launch_many", [(t.pk, 1) for t in tasks]),
         node.name, node.name),
    ]  # fmt: skip
    with CaptureQueriesContext(connection) as seen:
        assert lifecycle.launch_many([(t.pk, 1) for t in tasks]) == ["launched"] * 2
    assert len(seen.captured_queries) == 1, "one statement reads and records every attempt"
    for task, assignment in zip(tasks, spawned, strict=True):
        attempt = attempt_of(task)
        held = task.allocations.filter(released_at=None).order_by("gpu__index")
        assert attempt.gpu_uuids == [a.gpu.uuid for a in held] == assignment.gpu_uuids
        assert len(attempt.gpu_uuids) == 2
        assert attempt.log_path == str(paths.log_path(lab.name, task.pk, 1))
        assert (assignment.attempt_id, assignment.log_path) == (attempt.pk, attempt.log_path)
        assert (attempt.node, attempt.launched_by, attempt.stop_requested) == (node, "", "")
        assert (attempt.outcome, attempt.pid, attempt.started_at) == ("", None, None)
        assert attempt.created_at is not None
        assert (assignment.task_id, assignment.attempt_no, assignment.node) == (
            task.pk, 1, node.name
        )  # fmt: skip
        assert (assignment.tenant, assignment.command, assignment.env) == (lab.name, "true", {})
    assert len(spawned) == 2
    # A repeated delivery, with a pair asked twice, starts nothing more.
    again = [(t.pk, 1) for t in tasks] + [(tasks[0].pk, 1)]
    assert lifecycle.launch_many(again) == ["duplicate: already launched"] * 3
    assert len(spawned) == 2 and TaskAttempt.objects.filter(task__in=tasks).count() == 2


def test_a_pass_queues_its_launches_in_its_own_transaction(node, lab, monkeypatch, settings):
    """As in production (no inline queue): the node's job is committed with the placements,
    or rolled back with them; nothing is left to queue after the commit."""
    settings.LAUNCH_TASKS = True
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: None)  # no inline pass
    task = task_submit(tenant=lab, spec=TaskSpec(name="t", command="true", gpus_min=1))
    monkeypatch.setattr(Conf, "SYNC", False)
    jobs = OrmQ.objects.filter(key=node.name)

    def broken(decision, digests):
        assert jobs.count() == 1  # queued already, inside the pass
        raise RuntimeError("the pass fails after placing")

    with monkeypatch.context() as patched:
        patched.setattr(scheduler, "update_reasons", broken)
        with pytest.raises(RuntimeError):
            scheduler.schedule_pass()
    assert jobs.count() == 0  # rolled back with the placement
    assert Task.objects.get(pk=task.pk).state == "pending"

    with CaptureQueriesContext(connection) as seen:
        assert scheduler.schedule_pass().placed == [task.pk]
    assert Task.objects.get(pk=task.pk).state == "scheduled"
    (job,) = jobs
    assert SignedPackage.loads(job.payload)["args"] == ([(task.pk, 1)],)
    commits = [q for q in seen.captured_queries if q["sql"] == "COMMIT"]
    insert = next(i for i, q in enumerate(seen.captured_queries) if "django_q_ormq" in q["sql"])
    assert len(commits) == 1 and insert < seen.captured_queries.index(commits[0])


def test_a_launch_on_another_node_s_cluster_records_nothing(launcher, node, lab, monkeypatch):
    spawned = []
    monkeypatch.setattr(lifecycle, "spawn_supervisor", lambda a, **_: spawned.append(a))
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    task = task_submit(tenant=lab, spec=TaskSpec(name="here", command="true", gpus_min=1))
    scheduler.schedule_pass()

    assert lifecycle.launch_many([(task.pk, 1)], node="workstation-9") == [
        f"refused: this is workstation-9, the task was placed on {node.name}"
    ]
    assert not spawned and not TaskAttempt.objects.filter(task=task).exists()
    assert lifecycle.launch_many([(task.pk, 1)], node=node.name) == ["launched"]
    assert len(spawned) == 1 and attempt_of(task).launched_by == node.name


def test_a_pair_asked_twice_in_one_launch_is_launched_once(launcher, node, lab, monkeypatch):
    spawned = []
    monkeypatch.setattr(lifecycle, "spawn_supervisor", lambda a, **_: spawned.append(a))
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    spec = TaskSpec(name="twice", command="echo $A", workdir="runs/a", env={"A": "1"},
                    gpus_min=2, gpus_max=2, pids=50, timeout_s=60)  # fmt: skip
    task = tasks_submit(tenant=lab, specs=[spec])[0]
    scheduler.schedule_pass()
    assert lifecycle.launch_many([(task.pk, 1), (task.pk, 1), (task.pk, 2)]) == [
        "launched",
        "duplicate: already launched",
        "stale: the task moved on",
    ]
    assert [a.task_id for a in spawned] == [task.pk]
    # What the launch read in plain SQL is what the models say; the lease's fence_after is the
    # estate's, so that the supervisor needs no configuration parser of its own.
    fence_after_s = estate.config().heartbeat.fence_after_s
    assert spawned[0] == Assignment.of(attempt_of(task), fence_after_s=fence_after_s)
    assert spawned[0].resources["pids"] == 50 and len(spawned[0].gpu_uuids) == 2


def test_the_launch_statement_is_not_planned_again_at_every_call(launcher, node, lab, monkeypatch):
    """PostgreSQL keeps the prepared launch statement's generic plan (see ``_LAUNCH``)."""
    monkeypatch.setattr(lifecycle, "spawn_supervisor", lambda assignment, **_: None)
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    specs = [TaskSpec(name=f"t{i}", command="true", gpus_min=1) for i in range(3)]
    tasks = tasks_submit(tenant=lab, specs=specs)
    scheduler.schedule_pass()
    for _ in range(20):  # psycopg prepares it from the 6th; PostgreSQL plans 5 of those
        TaskAttempt.objects.filter(task__in=tasks).delete()
        assert lifecycle.launch_many([(t.pk, 1) for t in tasks]) == ["launched"] * 3
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%INSERT INTO scheduling_taskattempt%%'"
        )
        ((generic, custom),) = cursor.fetchall()
    assert generic >= 10, f"planned {custom} of 15 prepared calls"
