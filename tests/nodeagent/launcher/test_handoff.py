"""A plain end's GPUs go straight to the last pass's successors, in the transaction that frees
them; a pass waits for a hand-off under way; a pass is asked for when GPUs went to nobody."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from gpuplatform.dburl import current_database_url
from gpuplatform.procid import ProcessId
from nodeagent.launcher import lifecycle
from scheduling import controls, passes, scheduler
from scheduling.agentapi import handoff, reports
from scheduling.agentapi.messages import ExitReport, StartReport
from scheduling.models import GPU, Allocation, GpuState, Successor, Task, TaskAttempt, TaskEvent
from scheduling.policy import Placement
from scheduling.spec import PRIORITIES, TaskSpec
from scheduling.states import TaskState
from scheduling.submission import task_submit
from tenants.models import Quota
from tests.factories import NodeFactory, TenantFactory, make_gpus
from tests.nodeagent.launcher.conftest import state_of, wait_for
from tests.nodeagent.launcher.test_relay import blocked_on_a_lock, submit
from tests.nodeagent.launcher.test_spawner import running_spawner
from tests.plans import rows_visited

GONE = ProcessId(4_194_303, 0.0)  # no such process: the fixture's clean-up kills nothing


def running_and_waiting(lab, node, monkeypatch, running: int, waiting: int):
    """``running`` tasks placed by a pass and reported started (attempts made by hand), then
    ``waiting`` more, listed by a second pass as its successors. Nothing really starts: the
    pass's launches are dropped, the hand-off's are left in its ``HandOff``; the passes asked
    for are counted."""
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    queued: list = []
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: queued.append(kwargs))
    first = [submit(lab, "true", name=f"r{i}") for i in range(running)]
    scheduler.schedule_pass()
    attempts = [
        TaskAttempt.objects.create(task=t, number=1, node=node, gpu_uuids=[], log_path="")
        for t in first
    ]
    reports.attempts_started([StartReport(a.pk, GONE, GONE) for a in attempts])
    later = [submit(lab, "true", name=f"w{i}") for i in range(waiting)]
    scheduler.schedule_pass()
    queued.clear()
    return first, later, queued


def end(node, *tasks: Task, ready: bool = False) -> handoff.HandOff:
    """Plain ends of ``tasks`` as ``node``'s agent records them; what it handed on."""
    hand = handoff.HandOff(node.name, launcher=lifecycle)
    outcomes = reports.attempts_finished(
        [ExitReport(t.pk, 1, 0, ready=ready) for t in tasks], hand_off=hand
    )
    assert outcomes == {(t.pk, 1): "succeeded" for t in tasks}
    return hand


def gpu_of(task: Task) -> int:
    return Allocation.objects.get(task=task, attempt=1).gpu_id


def test_a_plain_end_hands_its_gpu_to_the_first_successor(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 3)
    assert list(Successor.objects.order_by("rank").values_list("task_id", flat=True)) == [
        t.pk for t in later
    ]
    freed = gpu_of(first[0])

    hand = end(node, first[0])

    successor = Task.objects.get(pk=later[0].pk)
    assert (successor.state, successor.node_id, successor.attempt) == ("scheduled", node.pk, 1)
    event = TaskEvent.objects.get(task=successor, to_state="scheduled")
    # Named by its index on the node, as pages and nvidia-smi name it, not its database id.
    assert event.reason == f"placed on {node.name} (GPU {GPU.objects.get(pk=freed).index})"
    assert Allocation.objects.get(task=successor, released_at__isnull=True).gpu_id == freed
    attempt = TaskAttempt.objects.get(task=successor, number=1)
    assert attempt.launched_by == node.name
    assert attempt.gpu_uuids == [Allocation.objects.get(task=successor).gpu.uuid]
    # Its supervisor did not offer to take it: the spawner starts it.
    assert hand.given == {}
    assert [(a.task_id, a.attempt_no, a.attempt_id) for a in hand.rest] == [
        (successor.pk, 1, attempt.pk)
    ]
    # It left the list; the others wait on it. Two of three are left: no pass is needed.
    assert set(Successor.objects.values_list("task_id", flat=True)) == {t.pk for t in later[1:]}
    assert queued == []


def test_a_ready_supervisor_is_given_the_attempt_on_its_gpus(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 3)
    hand = end(node, first[0], first[1], ready=True)
    assert hand.rest == []
    assert set(hand.given) == {first[0].pk, first[1].pk}
    taken = {gpu_of(t): t for t in later[:2]}
    for ended in first[:2]:
        assignment, sink = hand.given[ended.pk]
        assert taken[gpu_of(ended)].pk == assignment.task_id, "the one on its GPU"
        assert sink.endswith(f"/{assignment.task_id}/supervisor-1.log")


def test_gpus_that_no_successor_takes_ask_for_a_pass(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 1)
    hand = end(node, *first[:2])

    assert state_of(later[0], "scheduled")() == "scheduled"
    assert len(hand.rest) == 1
    assert len(queued) == 1, "one freed GPU went to nobody: a pass places it"
    assert not Successor.objects.exists()


def test_a_successor_cancelled_meanwhile_is_skipped(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 2)
    Task.objects.filter(pk=later[0].pk).update(state=TaskState.CANCELLED)

    hand = end(node, *first[:2])

    assert state_of(later[0], "cancelled")() == "cancelled"
    assert state_of(later[1], "scheduled")() == "scheduled"
    assert [a.task_id for a in hand.rest] == [later[1].pk]
    # Two GPUs freed, one successor left: the other GPU went to nobody, a pass places it.
    assert len(queued) == 1


def test_ends_on_another_node_or_without_one_hand_nothing(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 2)
    hand = handoff.HandOff("another-node", launcher=lifecycle)
    reports.attempts_finished([ExitReport(first[0].pk, 1, 0)], hand_off=hand)
    reports.attempts_finished([ExitReport(first[1].pk, 1, 0)])  # a supervisor writing itself
    assert [state_of(t, "pending")() for t in later] == ["pending", "pending"]
    assert (hand.given, hand.rest) == ({}, [])
    assert len(queued) == 1  # the first end asked for a pass; the second found it queued


def open_hand_off(node, ended: list[Task], successor: Task, gpu: int) -> psycopg.Connection:
    """An agent's transaction, stopped after its hand-off's writes, before its commit: it ended
    ``ended`` and handed ``gpu`` to ``successor``, whose row it holds."""
    other = psycopg.connect(current_database_url(), autocommit=False)
    now = reports.timezone.now()
    ends = [ExitReport(t.pk, 1, 0) for t in ended]
    other.execute(handoff._SUCCEEDED, handoff.succeeded_params(ends, now, claim=False))
    other.execute(handoff._CANDIDATES, {"tasks": [ended[0].pk], "now": now, "node": node.name})
    place = scheduler.place_query(
        [Placement(successor.pk, node.name, ((gpu, 24576),), exclusive=True)], now
    )
    other.execute(place.sql, place.params)
    return other


def pass_beside(other: psycopg.Connection) -> dict:
    """A pass run while ``other``'s hand-off is open, which it must not wait for; then the
    hand-off commits. Returns what the pass placed."""
    result: dict = {}

    def run_pass() -> None:
        try:
            result["placed"] = scheduler.schedule_pass().placed
        finally:
            connection.close()

    thread = threading.Thread(target=run_pass)
    thread.start()
    try:
        wait_for(lambda: blocked_on_a_lock(other) or result, timeout=10)
        thread.join(timeout=10)
        assert result, "the pass waited for a hand-off under way"
        other.commit()
    finally:
        other.close()
        thread.join(timeout=10)
    return result


@pytest.mark.parametrize("quota", [None, 8], ids=["no quota", "a quota"])
def test_a_pass_beside_a_hand_off_under_way(launcher, node, lab, monkeypatch, quota):
    """With a quota or without, the pass does not wait for the hand-off: it read both GPUs busy,
    and places nothing. Each GPU and each task is placed once."""
    if quota:
        Quota.objects.create(tenant=lab, max_gpus=quota)
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 2)
    assert set(Successor.objects.values_list("fenced", flat=True)) == {bool(quota)}
    freed = gpu_of(first[0])
    result = pass_beside(open_hand_off(node, first[:2], later[0], freed))
    assert result["placed"] == []
    assert gpu_of(later[0]) == freed
    assert Allocation.objects.filter(task__in=later, released_at__isnull=True).count() == 1


def test_a_pass_counts_a_quota_charged_successor_an_agent_may_be_starting(
    launcher, node, lab, monkeypatch
):
    """A tenant with room for one more GPU has its next task (pinned to a busy node) listed,
    charged to its quota. While that node's agent hands the task a GPU (not yet committed), a
    pass finds a GPU free on another node: it must not give it to the tenant's task behind,
    which would hold one GPU over the quota once the hand-off commits; nor wait for the
    hand-off."""
    spare = NodeFactory(name="workstation-2")
    (free_gpu,) = make_gpus(spare, count=1)
    GPU.objects.filter(pk=free_gpu.pk).update(state=GpuState.OFFLINE)  # none free at first
    other_lab = TenantFactory(name="other-lab")
    Quota.objects.create(tenant=lab, max_gpus=2)
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: None)
    with transaction.atomic():  # one pass: the lab holds one GPU, the other lab three
        mine = submit(lab, "true", name="mine")
        theirs = [submit(other_lab, "true", name=f"theirs{i}") for i in range(3)]
    scheduler.schedule_pass()
    attempts = [
        TaskAttempt.objects.create(task=t, number=1, node=node, gpu_uuids=[], log_path="")
        for t in [mine, *theirs]
    ]
    reports.attempts_started([StartReport(a.pk, GONE, GONE) for a in attempts])
    pinned = task_submit(tenant=lab, spec=TaskSpec(name="pinned", command="true", node=node.name))
    behind = submit(lab, "true", name="behind")
    scheduler.schedule_pass()
    listed = dict(Successor.objects.values_list("task_id", "fenced"))
    assert listed[pinned.pk] is True, "charged to the lab's quota: room for one"
    GPU.objects.filter(pk=free_gpu.pk).update(state=GpuState.AVAILABLE)  # back: free for a pass
    open_ = open_hand_off(node, [theirs[0]], pinned, gpu_of(theirs[0]))

    result = pass_beside(open_)

    assert result["placed"] == [], "the lab's task behind went over its quota"
    assert state_of(pinned, "scheduled")() == "scheduled"
    assert state_of(behind, "pending")() == "pending"
    held = Allocation.objects.filter(task__tenant=lab, released_at__isnull=True).count()
    assert held == 2


def test_through_the_relay_tasks_follow_each_other_on_the_freed_gpus(
    listening, node, lab, monkeypatch
):
    """No spawner listens: the agent starts the supervisors of what it handed on as new
    interpreters, never as forks of itself (it runs threads)."""
    forked: list[int] = []
    fork = lifecycle._fork_supervisor

    def recorded(assignment, sink) -> None:
        forked.append(assignment.task_id)
        fork(assignment, sink)

    monkeypatch.setattr(lifecycle, "_fork_supervisor", recorded)
    with transaction.atomic():  # one pass once they are all in: 4 run, 4 are listed
        tasks = [submit(lab, "true", name=f"t{i}") for i in range(10)]
    for task in tasks:
        wait_for(state_of(task, "succeeded"))
    handed = set(
        TaskAttempt.objects.filter(task__in=tasks, launched_by=node.name).values_list(
            "task_id", flat=True
        )
    )
    assert handed, "some were started by the agent's hand-off"
    assert not handed & set(forked), "the agent forked itself"


@pytest.fixture
def spawner(launcher, node):
    with running_spawner(node) as proc:
        yield proc


def test_a_ready_supervisor_runs_the_next_attempt_it_was_answered_with(
    spawner, listening, node, lab, monkeypatch
):
    hands: list[handoff.HandOff] = []

    class Recorded(handoff.HandOff):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            hands.append(self)

    monkeypatch.setattr(handoff, "HandOff", Recorded)
    with transaction.atomic():  # one pass once they are all in: 4 run, 4 are listed
        tasks = [submit(lab, "sleep 0.2", name=f"t{i}") for i in range(8)]
    for task in tasks:
        wait_for(state_of(task, "succeeded"))
    given = {
        (ended, assignment.task_id)
        for hand in hands
        for ended, (assignment, _) in hand.given.items()
    }
    assert given, "some supervisors were answered with their next attempt"
    for ended, following in given:
        before, after = (TaskAttempt.objects.get(task_id=pk) for pk in (ended, following))
        assert before.supervisor_pid == after.supervisor_pid, "the same process ran both"
        assert before.gpu_uuids == after.gpu_uuids, "on the GPU the first one freed"


def test_a_pass_takes_what_it_places_off_the_list_first(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 3)
    reports.attempts_finished([ExitReport(first[0].pk, 1, 0)])  # no agent: nothing handed on
    assert scheduler.schedule_pass().placed == [later[0].pk]
    assert not Successor.objects.filter(task=later[0]).exists(), "in no list, old or new"
    newest = Successor.objects.order_by("-generation").values_list("generation", flat=True)[0]
    assert set(Successor.objects.filter(generation=newest).values_list("task_id", flat=True)) == {
        t.pk for t in later[1:]
    }


def cancelled_as_it_is_placed(monkeypatch, task: Task) -> None:
    """``task`` is cancelled just before any placement, as if a hand-off or a cancel that
    committed meanwhile had taken it."""
    place_query = scheduler.place_query

    def cancelled_first(placements, now):
        Task.objects.filter(pk=task.pk).update(state=TaskState.CANCELLED)
        return place_query(placements, now)

    monkeypatch.setattr(scheduler, "place_query", cancelled_first)


def test_a_successor_taken_between_the_lock_and_its_placement_leaves_its_gpu_to_the_next(
    launcher, node, lab, monkeypatch
):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 4)
    cancelled_as_it_is_placed(monkeypatch, later[0])
    hand = end(node, first[0])
    assert state_of(later[0], "cancelled")() == "cancelled"
    assert state_of(later[1], "scheduled")() == "scheduled"
    assert gpu_of(later[1]) == gpu_of(first[0]), "read again and handed on, in one transaction"
    assert [a.task_id for a in hand.rest] == [later[1].pk]
    assert queued == [], "no GPU is left free: no pass"


def test_a_successor_taken_with_none_behind_it_asks_for_a_pass(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 1)
    cancelled_as_it_is_placed(monkeypatch, later[0])
    hand = end(node, first[0])
    assert (hand.given, hand.rest) == ({}, [])
    assert state_of(later[0], "cancelled")() == "cancelled"
    assert len(queued) == 1, "its GPU is free: a pass places it"


def test_a_pass_gives_a_skipped_placements_gpu_to_a_successor_no_agent_holds(
    launcher, node, lab, monkeypatch
):
    """The pass's placement of the head of its order is skipped (an agent handed it GPUs
    meanwhile): the GPU goes to the first listed task whose row no agent holds, in the same
    pass, and not to another pass."""
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 4)
    reports.attempts_finished([ExitReport(first[0].pk, 1, 0)])  # no agent: nothing handed on
    queued.clear()
    cancelled_as_it_is_placed(monkeypatch, later[0])
    agent = psycopg.connect(current_database_url(), autocommit=False)
    try:  # an agent under way with the second one's row
        agent.execute(
            "SELECT 1 FROM scheduling_successor WHERE task_id = %s FOR UPDATE", [later[1].pk]
        )
        placed = scheduler.schedule_pass().placed
    finally:
        agent.close()
    assert placed == [later[2].pk]
    assert gpu_of(later[2]) == gpu_of(first[0])
    assert state_of(later[1], "pending")() == "pending"
    assert queued == [], "no GPU is left free: no pass"
    newest = Successor.objects.order_by("-generation").values_list("generation", flat=True)[0]
    listed = Successor.objects.filter(generation=newest).order_by("rank")
    assert list(listed.values_list("task_id", flat=True)) == [later[1].pk, later[3].pk]


def test_a_pass_that_lists_nothing_takes_the_list_away(launcher, node, lab, monkeypatch):
    """An elastic task of higher priority comes first: only a pass can place it, so the pass
    lists nothing, and the list before it must not hand the next freed GPU to a task behind
    the elastic one."""
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 2)
    Task.objects.filter(pk__in=[t.pk for t in first]).update(preemptible=False)
    assert Successor.objects.count() == 2
    spec = TaskSpec(
        name="elastic", command="true", gpus_min=1, gpus_max=4, priority=PRIORITIES["high"]
    )
    elastic = task_submit(tenant=lab, spec=spec)
    assert scheduler.schedule_pass().placed == []
    assert not Successor.objects.exists()
    queued.clear()
    end(node, first[0])
    assert [state_of(t, "pending")() for t in later] == ["pending", "pending"]
    assert len(queued) == 1, "the freed GPU went to nobody: a pass places the elastic task"
    assert scheduler.schedule_pass().placed == [elastic.pk]


def test_a_pass_does_not_write_the_same_list_again(launcher, node, lab, monkeypatch):
    first, later, queued = running_and_waiting(lab, node, monkeypatch, 4, 3)
    Task.objects.filter(pk__in=[t.pk for t in first]).update(preemptible=False)
    listed = list(Successor.objects.order_by("rank").values_list("id", "generation", "task_id"))
    scheduler.schedule_pass()  # nothing changed
    again = list(Successor.objects.order_by("rank").values_list("id", "generation", "task_id"))
    assert again == listed, "the same rows, not a new generation"
    Task.objects.filter(pk=later[1].pk).update(priority=PRIORITIES["high"])
    scheduler.schedule_pass()  # the order changed: a new list
    newest = Successor.objects.order_by("-generation").values_list("generation", flat=True)[0]
    assert newest == listed[0][1] + 1
    ranked = Successor.objects.filter(generation=newest).order_by("rank")
    assert list(ranked.values_list("task_id", flat=True)) == [
        later[1].pk,
        later[0].pk,
        later[2].pk,
    ]


def test_the_candidates_count_the_list_once_whatever_they_skip(launcher, node, lab, monkeypatch):
    """What is left of the list was counted for each successor the statement went through:
    with the first ones locked by other agents' hand-offs, each one skipped cost a count of the
    whole list (14 rows for 4 GPUs in the throughput bench, each counting 246)."""
    first, _, _ = running_and_waiting(lab, node, monkeypatch, 4, 40)
    listed = Successor.objects.count()
    now = timezone.now()
    Allocation.objects.filter(task=first[0]).update(released_at=now)
    ranked = list(Successor.objects.order_by("rank").values_list("pk", flat=True))
    where = {"tasks": [first[0].pk], "now": now, "node": node.name}
    with psycopg.connect(current_database_url()) as other:
        other.execute("SELECT 1 FROM scheduling_successor WHERE id = ANY(%s) FOR UPDATE",
                      [ranked[:10]])  # fmt: skip
        visited = rows_visited(handoff._CANDIDATES, where, ["scheduling_successor"])
        (row,) = handoff.fetch_together(handoff.Query(handoff._CANDIDATES, where))[0]
    assert row[0] == ranked[10] and row[6] == listed  # the first free one; the list's length
    # Once for its length, once for each kind of successor it locks (whole, sharing), and the
    # rows skipped: not once per row gone through.
    assert visited <= 5 * listed


def sharing_a_card(node, lab, monkeypatch, count: int, waiting: list[tuple[str, int]]):
    """``count`` tasks sharing one card by 8 GiB each and three holding the others whole,
    placed by a pass and reported started; then ``waiting`` tasks (name, MiB shared; 0: whole),
    listed by a second pass. Returns the sharing tasks, their card, the waiting tasks and the
    passes asked for since."""
    monkeypatch.setattr(controls, "dispatch_launches", lambda placed: None)
    queued: list = []
    monkeypatch.setattr(passes, "async_task", lambda *args, **kwargs: queued.append(kwargs))

    def sharing(name: str, mb: int) -> Task:
        if not mb:
            return submit(lab, "true", name=name)
        return task_submit(tenant=lab, spec=TaskSpec(name=name, command="true", gpu_memory_mb=mb))

    with transaction.atomic():  # one pass: they share a card, three hold the others whole
        shares = [sharing(f"s{i}", 8192) for i in range(count)]
        whole = [submit(lab, "true", name=f"r{i}") for i in range(3)]
    scheduler.schedule_pass()
    (card,) = {gpu_of(t) for t in shares}
    assert {gpu_of(t) for t in whole}.isdisjoint({card})
    attempts = [
        TaskAttempt.objects.create(task=t, number=1, node=node, gpu_uuids=[], log_path="")
        for t in [*shares, *whole]
    ]
    reports.attempts_started([StartReport(a.pk, GONE, GONE) for a in attempts])
    later = [sharing(name, mb) for name, mb in waiting]
    scheduler.schedule_pass()
    assert Successor.objects.count() == len(later)
    queued.clear()
    return shares, card, later, queued


def test_memory_freed_on_a_card_others_still_share_goes_to_a_sharing_successor(
    launcher, node, lab, monkeypatch
):
    """A task sharing a card ends while others go on sharing it: what it held of the card goes
    to the first successor that shares no more than that, never to one that takes a card whole
    (the card is not free whole), and no pass is needed for it."""
    shares, card, later, queued = sharing_a_card(
        node, lab, monkeypatch, 3, [("w0", 0), ("w1", 12288), ("w2", 6144)]
    )

    hand = end(node, shares[0])

    assert [a.task_id for a in hand.rest] == [later[2].pk]
    share = Allocation.objects.get(task=later[2], released_at__isnull=True)
    assert (share.gpu_id, share.memory_mb, share.exclusive) == (card, 6144, False)
    assert [state_of(t, "pending")() for t in later[:2]] == ["pending", "pending"]
    assert queued == [], "two of three are left on the list, and nothing freed went to nobody"


def test_a_card_its_last_sharing_tasks_leave_is_not_handed_on_whole(
    launcher, node, lab, monkeypatch
):
    """Both tasks sharing a card end: nobody holds any of it now, but the rest of it was free to
    any pass meanwhile (one may be placing a share there), so a hand-off gives on only what they
    held, to a task that shares no more than that, never the card whole."""
    shares, card, later, _ = sharing_a_card(node, lab, monkeypatch, 2, [("w0", 0), ("w1", 12288)])

    hand = end(node, *shares)

    assert [a.task_id for a in hand.rest] == [later[1].pk]
    assert state_of(later[0], "pending")() == "pending"
    share = Allocation.objects.get(task=later[1], released_at__isnull=True)
    assert (share.gpu_id, share.memory_mb, share.exclusive) == (card, 12288, False)


def test_a_second_round_offers_nothing_the_first_gave(launcher, node, lab, monkeypatch):
    """A round of a hand-off whose placement was skipped reads the freed GPUs again
    (``HAND_OFF_ROUNDS``): what the first round gave of them, whole or in part, is not free.
    Offered again, a share went onto a GPU just given whole, and the capacity trigger failed the
    agent's whole batch of ends."""
    shares, card, later, _ = sharing_a_card(node, lab, monkeypatch, 2, [("w0", 0)])
    whole = Task.objects.filter(tenant=lab, state=TaskState.RUNNING).exclude(
        pk__in=[t.pk for t in shares]
    )[0]
    other = psycopg.connect(current_database_url(), autocommit=False)
    try:
        now = reports.timezone.now()
        ended = [whole, *shares]
        ends = [ExitReport(t.pk, 1, 0) for t in ended]
        other.execute(handoff._SUCCEEDED, handoff.succeeded_params(ends, now, claim=False))
        where = {"tasks": [t.pk for t in ended], "now": now, "node": node.name}

        def offered() -> dict[int, tuple[int, int]]:
            rows = other.execute(handoff._FREED, where).fetchall()
            return {gpu: (whole_mb, shares_mb) for gpu, whole_mb, shares_mb, *_ in rows}

        held = gpu_of(whole)
        assert offered() == {held: (24576, 24576), card: (0, 16384)}
        # The first round gives the whole one's GPU whole, and 6 GiB of the shared card.
        first = later[0]
        sharer = task_submit(
            tenant=lab, spec=TaskSpec(name="x", command="true", gpu_memory_mb=6144)
        )
        place = scheduler.place_query(
            [
                Placement(first.pk, node.name, ((held, 24576),), exclusive=True),
                Placement(sharer.pk, node.name, ((card, 6144),), exclusive=False),
            ],
            now,
        )
        other.execute(place.sql, place.params)
        assert offered() == {card: (0, 10240)}  # nothing left of the one given whole
    finally:
        other.rollback()
        other.close()
