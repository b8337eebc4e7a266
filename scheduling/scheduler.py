"""The scheduling service: snapshot from PostgreSQL, the pure policy, decisions applied.

One pass runs in one transaction under a cluster-wide advisory lock, so passes from any number
of processes take turns and each sees the previous one's allocations. Placements are written
in bulk (one UPDATE, one INSERT of allocations, one of events), and PostgreSQL's allocation
trigger refuses an over-allocation even if this code had a bug.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import time
import zlib
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection, transaction
from django.utils import timezone

from gpuplatform import events
from gpuplatform.db import Query, fetch_together, server_bound_cursor
from scheduling import (
    controls,
    estate,
    fairshare,
    forecasts,
    passes,
    planner_stats,
    states,
    transitions,
    wait_reasons,
)
from scheduling.models import (
    Task,
)
from scheduling.policy import (
    Decision,
    Freed,
    Placement,
    Snapshot,
    Wait,
    hand_on,
    schedule,
)
from scheduling.policy.forecast import FORECAST_LIMIT, forecast
from scheduling.snapshot import (
    LINKS,
    SnapshotRows,
    after_failing,
    build_snapshot,
    fail_broken_dependencies,
    snapshot_queries,
)
from scheduling.states import TaskState

logger = logging.getLogger(__name__)

PASS_LOCK = zlib.crc32(b"gpuplatform.scheduling.pass")
FAILED_DEPENDENCY = (TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMED_OUT)
WAKE_MIN_GAP_S = 1.0  # a time-based pass is booked at least this long after the one booking it


@dataclass
class PassResult:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    waiting: int = 0
    idle_gpus: int = 0  # schedulable GPUs that no task holds once the placements are made
    ms: float = 0.0
    wake_at: datetime | None = None  # the next pass booked for a time-based wait


def schedule_pass() -> PassResult:
    """Run one pass now (waiting for any pass already running elsewhere to finish)."""
    # A pass builds tens of thousands of short-lived objects (one view per waiting task, their
    # reasons) that hold no reference cycles: left on, the cycle collector ran full collections
    # in the middle of passes, for nothing. It is off for the pass, and back on (if it was) as
    # soon as the pass ends.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _schedule_pass()
    finally:
        if collecting:
            gc.enable()


def _schedule_pass() -> PassResult:
    began = time.perf_counter()
    result = PassResult()
    # The queued flag is cleared in a statement that commits before the pass reads anything, so
    # that a request committed after this pass read its snapshot finds no pass queued and
    # queues one (passes.py). Cleared inside the pass's transaction it stayed set for others
    # until the pass committed: a task submitted while a pass ran was seen by neither that pass
    # nor a next one (seen on a real GPU host). It is cleared only once a pass already running
    # has committed (its lock taken, and let go at once when not in a transaction): requests
    # made meanwhile then find it still set for this pass, which will see them, rather than
    # each queueing one more.
    _take_pass_lock()
    passes.mark_started()
    with transaction.atomic():
        now = timezone.now()
        half_life = estate.config().scheduling.fair_share_half_life_s
        links, rows = _read_for_pass(now, half_life)
        # Rare: counters kept for another half-life are rebuilt, and tasks whose dependencies
        # failed fail; the snapshot is then read again, after those writes.
        rebuilt = not fairshare.counters_kept(rows.usage, half_life) and (
            fairshare.keep_counters_for(now, half_life)
        )
        result.failed = fail_broken_dependencies(links)
        digests: dict[int, int] = {}
        snapshot = build_snapshot(
            now, digests, dependency_links=after_failing(links, result.failed),
            rows=None if rebuilt or result.failed else rows,
        )  # fmt: skip
        decision = schedule(snapshot, estate.config().scheduling.policy_settings())
        # Stamped after the snapshot: an allocation released while it was taken must not
        # appear to overlap the one that replaces it.
        result.placed = apply_placements(decision, timezone.now())
        result.preempted = apply_preemptions(decision)
        result.waiting = update_reasons(decision, digests)
        result.idle_gpus = idle_gpus(snapshot, decision)
        list_successors(decision, placed=set(result.placed))
        # The policy says when a wait ends by time alone (backoff, starvation, reclaim); at
        # most one such pass a second, so tasks crossing starvation_after one after another
        # (a backlog submitted over hours) do not keep the scheduler busy with a pass each.
        if decision.wake_at is not None:
            wake_at = max(decision.wake_at, now.timestamp() + WAKE_MIN_GAP_S)
            result.wake_at = datetime.fromtimestamp(wake_at, UTC)
            passes.book_wake_up(result.wake_at)
        starts = forecast_starts(snapshot, decision)
        result.ms = (time.perf_counter() - began) * 1000
        record_pass(result, now, decision.line, starts)
        events.publish(
            events.SCHEDULER,
            {
                "last_pass_at": now.timestamp(),
                "last_pass_ms": round(result.ms, 1),
                "placed": len(result.placed),
                "preempted": len(result.preempted),
                "waiting": result.waiting,
            },
        )
    planner_stats.keep_up()  # after the commit: the pass's lock is let go
    if result.placed or result.preempted or result.failed:
        logger.info(
            "pass: %d placed, %d preempted, %d failed (dependencies), %d waiting, %.1f ms",
            len(result.placed),
            len(result.preempted),
            len(result.failed),
            result.waiting,
            result.ms,
        )
    return result


_LOCK = "SELECT pg_advisory_xact_lock(%s)"


def _take_pass_lock() -> None:
    """Wait until no other pass runs; held until the transaction ends (at once outside one)."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK, [PASS_LOCK])


def _read_for_pass(
    now: datetime, half_life: float
) -> tuple[list[tuple[int, int, str, str]], SnapshotRows]:
    """The pass's lock, then everything it reads (its dependency links and its snapshot's
    rows), in one round trip (``fetch_together``): read one after another, a pass's reads
    waited far longer for the server and the scheduler to be scheduled in turn than they
    spent working on a busy machine."""
    _, _, links, *read = fetch_together(
        Query(_LOCK, [PASS_LOCK]),
        Query(_FORGET_SPENT),
        Query(LINKS),
        *snapshot_queries(now, half_life),
    )
    return links, SnapshotRows.of(read)


# A pass and the node agents' hand-offs (``launcher.handoff``) are kept apart where it matters.
# Agents take from the newest list only. A pass, before it reads anything, deletes the older
# lists: a hand-off holds its rows until it commits, so this waits for every hand-off under way
# from them, and the snapshot sees its placements; a later one finds them gone. The newest list
# stays usable while the pass runs (a GPU freed and handed on in one transaction is never free in
# any snapshot; a task placed by both is placed by the first: each placement needs the task still
# pending), and the pass's own list, a new generation, takes over when it commits. So that no pass
# places a tenant's tasks on a count of its usage that a hand-off changes meanwhile, the pass
# counts each successor of that list charged to a quota (``fenced``) that it reads still pending
# as started (``snapshot._PROMISED``, ``policy.Promise``); a swap (``Successor.swap``) changes no
# count: it takes only what its own tenant's ended tasks free. Deleting the charged successors
# before reading instead (and waiting for the hand-offs that held them) left the agents nothing to
# hand a tenant under a quota for most of each pass, and passes followed one another. It only
# inserts rows: it never waits for an agent while it holds what the agent's hand-off needs (the
# tasks it placed, its tenants' usage counters). Waiting for the agents there, the passes and the
# agents deadlocked; deleting the whole list before reading left the agents nothing to hand for
# most of each pass.
_FORGET_SPENT = """
    DELETE FROM scheduling_successor
     WHERE generation < (SELECT max(generation) FROM scheduling_successor)
"""


# The tasks a pass places leave the newest list before they are placed (in the same round
# trip): a hand-off under way with one of them is waited for (its placement then stands, and
# the pass's is skipped), and none starts after. Placed without this, an agent handing one on
# waited for the pass to commit (about as long as the pass) and then found the task placed.
_UNLIST = "DELETE FROM scheduling_successor WHERE task_id = ANY(%s::bigint[])"


def list_successors(decision: Decision, placed: Container[int] = frozenset()) -> None:
    """Store the decision's successors (``models.Successor``) as the newest list, for the node
    agents to take from once the pass commits, less those the pass ``placed`` (on GPUs of its
    skipped placements). Each distinct set of GPUs is sent once (most successors may take the
    same GPUs). A list the same as the newest one, row for row, is not written again; a pass
    that lists nothing takes the newest list away (``_UNLIST_ALL``)."""
    successors = [s for s in decision.successors if s.task_id not in placed]
    if not successors:
        with connection.cursor() as cursor:
            cursor.execute(_UNLIST_ALL)
        return
    sets: dict[tuple[int, ...], int] = {}
    for successor in successors:
        sets.setdefault(successor.gpu_ids, len(sets) + 1)
    with server_bound_cursor() as cursor:
        cursor.execute(
            _LIST_SUCCESSORS,
            {
                "tasks": [s.task_id for s in successors],
                "gpus": [s.gpus for s in successors],
                "set_of": [sets[s.gpu_ids] for s in successors],
                "sets": ["{" + ",".join(map(str, ids)) + "}" for ids in sets],
                "fenced": [s.fenced for s in successors],
                "swap": [s.swap for s in successors],
                "one_for_one": [s.one_for_one for s in successors],
                "memory": [s.memory_mb for s in successors],
                "listed": len(successors),
            },
        )


# The new list, unless the newest one is the same, row for row, and whole (no row taken): with
# a backlog that does not move each pass would write the same rows, and the next pass delete
# them.
_LIST_SUCCESSORS = """
    WITH sets AS (SELECT n, ids::integer[] AS ids
                    FROM unnest(%(sets)s::text[]) WITH ORDINALITY AS u(ids, n)),
    new AS (SELECT s.task_id, s.rank, s.gpus, sets.ids, s.fenced, s.swap, s.memory_mb,
                   s.one_for_one
              FROM unnest(%(tasks)s::bigint[], %(gpus)s::integer[], %(set_of)s::integer[],
                          %(fenced)s::boolean[], %(swap)s::boolean[], %(memory)s::integer[],
                          %(one_for_one)s::boolean[])
                   WITH ORDINALITY AS s(task_id, gpus, set_of, fenced, swap, memory_mb,
                                        one_for_one, rank)
              JOIN sets ON sets.n = s.set_of),
    newest AS (SELECT task_id, rank, gpus, gpu_ids, fenced, swap_tenant IS NOT NULL AS swap,
                      memory_mb, one_for_one
                 FROM scheduling_successor
                WHERE generation = (SELECT max(generation) FROM scheduling_successor)),
    kept AS (SELECT (SELECT count(*) FROM newest) = %(listed)s
                    AND NOT EXISTS (SELECT 1 FROM new FULL JOIN newest o ON o.rank = new.rank
                                     WHERE o.task_id IS DISTINCT FROM new.task_id
                                        OR o.gpus IS DISTINCT FROM new.gpus
                                        OR o.fenced IS DISTINCT FROM new.fenced
                                        OR o.swap IS DISTINCT FROM new.swap
                                        OR o.memory_mb IS DISTINCT FROM new.memory_mb
                                        OR o.one_for_one IS DISTINCT FROM new.one_for_one
                                        OR o.gpu_ids IS DISTINCT FROM new.ids) AS same)
    INSERT INTO scheduling_successor
           (generation, task_id, rank, listed, gpus, gpu_ids, fenced, swap_tenant, memory_mb,
            one_for_one)
    SELECT (SELECT COALESCE(max(generation), 0) + 1 FROM scheduling_successor),
           task_id, rank, %(listed)s, gpus, ids, fenced,
           CASE WHEN swap THEN (SELECT t.tenant_id FROM scheduling_task t WHERE t.id = new.task_id)
           END,
           memory_mb, one_for_one
      FROM new
     WHERE NOT (SELECT same FROM kept)
"""

# A pass that lists nothing (a class may take back borrowed GPUs, or an elastic or shared task
# heads the line) takes the newest list away, or agents would go on handing GPUs from it, past
# the task the pass stopped at. Rows an agent holds are skipped, not waited for (see
# _FORGET_SPENT): that agent is placing them, and deletes them itself.
_UNLIST_ALL = """
    DELETE FROM scheduling_successor
     WHERE id IN (SELECT id FROM scheduling_successor FOR UPDATE SKIP LOCKED)
"""


# --- Applying decisions --------------------------------------------------------------------------


def apply_placements(decision: Decision, now: datetime) -> list[int]:
    """Pending -> scheduled for every placement, with its allocations and events, in bulk.

    The UPDATE only touches tasks still pending, so a task cancelled since the snapshot is
    simply skipped (the snapshot was taken under the pass lock, but cancels do not take it),
    as is one a node agent handed GPUs meanwhile (``_UNLIST``, first, in the same round trip).
    The GPUs of a skipped placement go to the pass's first successors no agent holds
    (``_stand_ins``); a pass is asked for if some are still free. The launches are queued for
    the nodes in the pass's transaction, from what it wrote.
    """
    placements = list(decision.placements)
    if not placements:
        return []
    returned = _place_unlisted(placements, now)
    if skipped := [p for p in placements if p.task_id not in returned]:
        stand_ins, still_free = _stand_ins(decision, skipped)
        if stand_ins:
            returned.update(_place_unlisted(stand_ins, now))
            placements += stand_ins
        if still_free or any(p.task_id not in returned for p in stand_ins):
            passes.request_pass()
    placed, launches = [], []
    for p in placements:
        if p.task_id not in returned:
            continue  # no longer pending, or its node is gone
        attempt, tenant_id, node_id = returned[p.task_id]
        placed.append((p.task_id, tenant_id, node_id, [gpu_id for gpu_id, _ in p.gpus]))
        launches.append((p.task_id, attempt, p.node))
    controls.dispatch_launches(launches)  # in this transaction, before the live events
    events.publish(events.PLACEMENTS, placed)
    return list(returned)


def _place_unlisted(placements: list[Placement], now: datetime) -> dict[int, tuple]:
    """Take these tasks off the successor lists and place them, in one round trip; returns
    (attempt, tenant id, node id) by placed task id."""
    _, rows = fetch_together(
        Query(_UNLIST, [[p.task_id for p in placements]]),
        place_query(placements, now),
    )
    return {task_id: tuple(row) for task_id, *row in rows}


def _stand_ins(decision: Decision, skipped: list[Placement]) -> tuple[list[Placement], bool]:
    """Placements, on the whole GPUs of the ``skipped`` ones, for the decision's first
    successors that are still pending and listed, and that no node agent is handing GPUs
    (``_LOCK_STAND_INS``), in rank order; and whether GPUs are left that none of them took.

    A placement is skipped mostly because an agent handed the same task GPUs while the pass
    ran: the head of the pass's order is the head of the list the agents take from. Asking
    for another pass instead, the next one placed the same head and lost it again, and freed
    GPUs stood idle through a run of such passes. The successors' quotas were counted as if all
    of them and all the placements started, so any of them may take a placement's GPUs, but a
    swap (``Successor.swap``), which was not counted: it may take only GPUs its tenant's ended
    tasks free."""
    free: dict[str, list[Freed]] = defaultdict(list)
    shared = False
    for p in skipped:
        if p.exclusive:
            free[p.node].extend(Freed(gpu, mb, mb) for gpu, mb in p.gpus)
        else:
            shared = True  # a share of a GPU: only a pass places it again
    count = sum(len(gpus) for gpus in free.values())
    if not (decision.successors and count):
        return [], bool(count) or shared
    listed = [s for s in decision.successors if not s.swap]
    if not listed:
        return [], True
    ids = [s.task_id for s in listed]  # the placed ones are no longer pending
    with server_bound_cursor() as cursor:
        cursor.execute(_LOCK_STAND_INS, {"ids": ids, "limit": count})
        locked = {task_id for (task_id,) in cursor.fetchall()}
    candidates = [s for s in listed if s.task_id in locked]
    stand_ins, left = [], False
    for node, gpus in free.items():
        placed, unused = hand_on(candidates, gpus, node)
        stand_ins += placed
        left = left or bool(unused)
        taken = {p.task_id for p in placed}
        candidates = [c for c in candidates if c.task_id not in taken]
    return stand_ins, left or shared


# Successors for a skipped placement's GPUs, in the list's order, still pending, whose rows in
# the agents' list no agent holds (``SKIP LOCKED``): locked, so none starts handing them on
# until the pass commits, and deleted as they are placed (``_place_unlisted``). Their rows, not
# their tasks: an agent reaches a task only through its row and places it while holding that,
# so the pass never waits for an agent that may wait for the pass. A task without a row in the
# list (submitted since) is not taken: a row held by an agent cannot be told from none.
_LOCK_STAND_INS = """
    SELECT s.task_id
      FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, n)
      JOIN scheduling_successor s ON s.task_id = u.id
     WHERE (SELECT t.state = 'pending' AND t.hold_reason = ''
              FROM scheduling_task t WHERE t.id = s.task_id)
     ORDER BY u.n
     LIMIT %(limit)s
       FOR UPDATE OF s SKIP LOCKED
"""


def place_query(placements: list[Placement], now: datetime) -> Query:
    """``_PLACE`` for these placements, stamped ``now``."""
    shares = [(p.task_id, gpu_id, mb, p.exclusive) for p in placements
              for gpu_id, mb in p.gpus]  # fmt: skip
    return Query(
        _PLACE,
        {
            "now": now,
            "ids": [p.task_id for p in placements],
            "nodes": [p.node for p in placements],
            "reasons": [f"placed on {p.node}" for p in placements],
            "s_task": [task_id for task_id, *_ in shares],
            "s_gpu": [gpu_id for _, gpu_id, _, _ in shares],
            "s_mb": [mb for _, _, mb, _ in shares],
            "s_exclusive": [exclusive for *_, exclusive in shares],
        },
    )


# Each placed task still pending becomes scheduled on its node, with an allocation per GPU
# share (the trigger of migration 0003 refuses one over a GPU's capacity, failing the pass)
# and its event, in one statement. Returns (task id, attempt, tenant id, node id) of each placed.
# The event names the GPUs by their index on the node, as every page and nvidia-smi do.
# The tasks are found by their keys alone: as "state = 'pending'" the planner, without
# statistics (no ANALYZE yet, or autovacuum off), took the state's index and read every pending
# task to place one (each of a node agent's hand-offs read the whole backlog: tests/scheduling/
# test_place_query.py); ``transitions.moved`` checks the state in a form no index serves.
# The arrays through scalar subqueries and the tasks matched by key with ANY, as in
# ``agentapi.handoff._SUCCEEDED``: a node agent's hand-off places one or two tasks, and each
# call was planned again.
_PLACING = transitions.moved(
    "t",
    TaskState.PENDING,
    TaskState.SCHEDULED,
    source="v",
    where="t.id = v.id AND t.id = ANY((SELECT %(ids)s::bigint[])::bigint[])",
    sets="node_id = v.node_id, attempt = t.attempt + 1",
    event_reason="v.reason",
    event_code="'placed'",
    event_params="v.params",
    returning="t.tenant_id, t.node_id",
)
_PLACE = f"""
    WITH v AS (SELECT v.id, n.id AS node_id,
                      v.reason || ' (GPU ' || COALESCE(i.indexes, 'none') || ')' AS reason,
                      jsonb_build_object('node', v.node, 'gpus', COALESCE(i.indexes, 'none'))
                          AS params
                 FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(nodes)s::text[]),
                             (SELECT %(reasons)s::text[])) AS v(id, node, reason)
                 JOIN scheduling_node n ON n.name = v.node
                 LEFT JOIN (SELECT s.task_id,
                                   string_agg(g.index::text, ', ' ORDER BY g.index) AS indexes
                              FROM unnest((SELECT %(s_task)s::bigint[]),
                                          (SELECT %(s_gpu)s::bigint[])) AS s(task_id, gpu_id)
                              JOIN scheduling_gpu g ON g.id = s.gpu_id
                             GROUP BY s.task_id) i ON i.task_id = v.id),
    {_PLACING},
    shares AS (INSERT INTO scheduling_allocation
                      (task_id, attempt, gpu_id, memory_mb, exclusive, started_at)
               SELECT s.task_id, t.attempt, s.gpu_id, s.mb, s.exclusive, %(now)s
                 FROM unnest((SELECT %(s_task)s::bigint[]), (SELECT %(s_gpu)s::bigint[]),
                             (SELECT %(s_mb)s::integer[]), (SELECT %(s_exclusive)s::boolean[]))
                      AS s(task_id, gpu_id, mb, exclusive)
                 JOIN t ON t.id = s.task_id)
    SELECT id, attempt, tenant_id, node_id FROM t
"""  # noqa: S608 - constant text


def apply_preemptions(decision: Decision) -> list[int]:
    done = []
    victims = Task.objects.in_bulk([p.task_id for p in decision.preemptions])
    for preemption in decision.preemptions:
        task = victims.get(preemption.task_id)
        if task is None:
            continue
        try:
            reason = wait_reasons.of_preemption(preemption)
            controls.task_preempt(task=task, reason=reason)
        except (transitions.StaleTask, states.IllegalTransition):
            continue
        done.append(task.pk)
    return done


# The waiting tasks whose reason changed, less those a node agent is placing now (locked: its
# hand-off commits them as placed, or the next pass writes their reason). Waiting for such a
# lock held the pass for the agent's whole transaction, and with the agent then waiting for a
# task the pass had already written, the two deadlocked (PostgreSQL broke it after a second).
_REASONS = """
    WITH v AS (SELECT * FROM unnest(%s::bigint[], %s::int[]) AS v(id, n)),
    free AS (SELECT t.id, v.n FROM scheduling_task t JOIN v ON v.id = t.id
              WHERE t.state = %s
                FOR NO KEY UPDATE OF t SKIP LOCKED)
    UPDATE scheduling_task AS t
       SET reason = (%s::text[])[free.n], wait = (%s::jsonb[])[free.n],
           wait_digest = (%s::bigint[])[free.n], reason_code = (%s::text[])[free.n],
           reason_params = (%s::jsonb[])[free.n]
      FROM free
     WHERE t.id = free.id
 RETURNING t.id, t.tenant_id, t.reason, t.reason_code, t.reason_params
"""


def update_reasons(decision: Decision, digests: dict[int, int]) -> int:
    """Store why each task waits, as text and as data (``Task.wait``), without its place in
    line (``record_pass``): both stay the same from pass to pass until something about the
    task's wait changes, and only the tasks whose wait changed are written, in one statement.

    ``digests`` holds what each task's row says now (its ``wait_digest``). A pass gives one
    Wait object to all the tasks of a shape it blocked, so the text, the JSON and the digest are
    made once per distinct wait, not once per task, and so is its reason as data
    (``wait_reasons``), from which readers render it in their language."""
    if decision.waits:
        waits = decision.waits.items()
    else:  # a policy that gives text only (a baseline, a test's)
        texts = decision.waiting
        by_text = {text: Wait("other", text) for text in set(texts.values())}
        waits = ((task_id, by_text[text]) for task_id, text in texts.items())
    index: dict[int, int] = {}  # id(Wait) -> its place in the arrays below
    reasons: list[str] = []
    codes: list[str] = []
    params: list[str] = []
    records: list[str] = []
    digest_of: list[int] = []
    ids: list[int] = []
    which: list[int] = []
    count = 0
    for task_id, why in waits:
        count += 1
        n = index.get(id(why))
        if n is None:
            n = index[id(why)] = len(reasons)
            record = json.dumps({"code": why.code, "details": why.details}, sort_keys=True)
            reason = wait_reasons.of_wait(why)
            reasons.append(why.text)
            codes.append(reason.code)
            params.append(json.dumps(reason.params))
            records.append(record)
            # Of everything the row stores: a row written before its reason had a code (the
            # same text and wait) is written again, with it.
            digest_of.append(_digest(why.text, f"{record}\0{reason.code}\0{params[-1]}"))
        if digests.get(task_id) != digest_of[n]:
            ids.append(task_id)
            which.append(n + 1)  # SQL arrays count from 1
    if ids:
        with server_bound_cursor() as cursor:
            cursor.execute(
                _REASONS,
                [ids, which, TaskState.PENDING.value, reasons, records, digest_of, codes, params],
            )
            # Only the reasons that changed: an unchanged queue costs the pages nothing.
            events.publish(events.REASONS, cursor.fetchall())
    return count


def idle_gpus(snapshot: Snapshot, decision: Decision) -> int:
    """How many schedulable GPUs no task holds once the decision's placements are made (its
    preemptions free theirs only when the victims have stopped)."""
    taken = {gpu_id for placement in decision.placements for gpu_id, _ in placement.gpus}
    return sum(
        1 for gpu in snapshot.gpus if gpu.schedulable and not gpu.holders and gpu.id not in taken
    )


def forecast_starts(snapshot: Snapshot, decision: Decision) -> dict[str, list]:
    """When the first tasks in line are expected to start (``policy.forecast``), once the
    decision's placements have started, from the running tasks' and their own typical
    runtimes (``forecasts.runtimes_for``), as stored."""
    if not decision.line:
        return {}
    ahead = decision.line[:FORECAST_LIMIT]
    started = [task.id for task in snapshot.running] + [p.task_id for p in decision.placements]
    runtimes = forecasts.runtimes_for(started + ahead)
    estimates = forecast(snapshot, ahead, runtimes, placements=decision.placements)
    return {str(task_id): estimate.as_list() for task_id, estimate in estimates.items()}


def record_pass(
    result: PassResult, now: datetime, line: list[int], starts: dict | None = None
) -> None:
    """The pass's figures, and the tasks waiting for GPUs or quota in the order they would
    start (``line``), in one statement on the scheduler's row (which ``keep_counters_for`` made
    sure exists). The line is one array, so a placement ahead of 10,000 waiting tasks moves
    their places without rewriting them, and it is not written again while it stays the same.
    ``starts``: the first tasks' start estimates (``forecast_starts``)."""
    digest = hash(tuple(line))
    # As the array's text: psycopg dumps a Python list element by element in Python; joining
    # the digits costs a fraction of that.
    text = "{" + ",".join(map(str, line)) + "}"
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE scheduling_schedulerstate
               SET passes = passes + 1, last_pass_at = %s, last_pass_ms = %s,
                   last_placed = %s, last_preempted = %s, last_waiting = %s,
                   last_idle_gpus = %s, forecast = %s::jsonb,
                   line = CASE WHEN line_digest <> %s THEN %s::bigint[] ELSE line END,
                   line_digest = %s
             WHERE id = 1
            """,
            [
                now,
                round(result.ms, 1),
                len(result.placed),
                len(result.preempted),
                result.waiting,
                result.idle_gpus,
                json.dumps(starts or {}),
                digest,
                text,
                digest,
            ],
        )


def _digest(reason: str, record: str) -> int:
    """A signed 64-bit digest of a stored (reason, wait and reason as data): what bigint
    holds."""
    raw = hashlib.blake2b(f"{reason}\0{record}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big", signed=True) or 1  # 0 means "not written by a pass"
