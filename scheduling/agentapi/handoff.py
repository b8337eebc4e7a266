"""A finished task's GPUs handed straight to the next task, in the transaction that frees them.

Without this a GPU freed by a plain end waited for a scheduling pass to be queued, picked up,
run and committed, and for the launch job it queued to be picked up on the node: with many
short tasks, GPUs stood idle while tasks waited. Each pass now also lists its successors
(``policy.Decision.successors``, stored as ``models.Successor``): the tasks it would start
next as GPUs free up, in its own order, each with the GPUs it may take and with quotas counted
as if all of them had started. The node agent that records plain ends (``reports``) then, in
the same transaction:

1. releases the ended tasks' GPUs (``_SUCCEEDED``) and locks the first successors
   that may take some of them still fit to use (``_FREED``: on its node, available, no
   foreign process; whole where an ended task held it whole, and as the memory the ended tasks
   held of it for tasks that share GPUs), in one round trip (``_CANDIDATES``, ``SKIP LOCKED``);
2. gives each successor, in rank order, the first freed GPUs it may take
   (``policy.hand_on``: several sharing successors may split one), places them as a pass
   places (``scheduler.place_query``), records
   their attempts as a launch job does (the agent's ``HandOff.launcher``) and deletes their rows
   (a placement skipped because its task was placed meanwhile leaves its GPUs to the next
   successor, read again: ``HAND_OFF_ROUNDS``);
3. after the commit, answers the supervisor whose task freed a successor's GPUs with that
   attempt, if it offered to take one (``ExitReport.ready``): it runs it at once, with no
   fork and no spawner; any other attempt goes to the node's spawner, as a launch job's would.

Why this keeps the pass's promises: agents take from the newest list only, and a pass, before it
reads anything, deletes the older lists (``scheduler._FORGET_SPENT``), waiting for every hand-off
that holds one of their rows, so its snapshot sees their placements and no later hand-off takes one.
The quotas of a list count every one of its successors as started, and so does the next pass for
each one charged to a quota that it reads still pending (``policy.Promise``): between two passes
only hand-offs place, and only listed tasks. A tenant with no room left in its quota has its tasks
listed as swaps (``policy.Successor.swap``): a swap takes only what its own tenant's tasks ended
here freed (GPUs, or memory on them), and one ended task for one started where the tenant's quotas
count running tasks (``one_for_one``), so its tenant holds no more than it did, in any count a pass
may read, and it needs no counting. Any successor may start while a pass runs: its GPU (or the
memory it shares of one) was never free in the pass's snapshot, and a task that both would place is
taken off the list by the pass before it places it (``scheduler._place_unlisted``), waiting for a
hand-off under way; a placement needs the task still pending, so the second one is skipped, and the
pass gives its GPUs to its next successors that no agent holds (``scheduler._stand_ins``; swaps
excepted). A listed task cancelled meanwhile is skipped by the same condition.

A pass is requested as before when GPUs freed here went to nobody, and when fewer than half of
the list is left, so the next list is ready before this one runs out.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db import connection, transaction
from django.utils import timezone

from gpuplatform import events
from gpuplatform.db import Query, compact, fetch_together, server_bound_cursor
from scheduling import agent_notes, passes, scheduler, transitions
from scheduling.agentapi.messages import Assignment, ExitReport
from scheduling.nodecredentials import node_scope
from scheduling.policy import Freed, Placement, hand_on
from scheduling.states import TaskState

# A placement is skipped when its task was placed after the list was read: by a hand-off from
# the list before, under way as the pass that listed the task again committed, by a pass, or
# cancelled. The GPUs still free are then read again with their successors, which now sees it,
# and handed on rather than left free until the next pass: at most this many rounds in one
# transaction.
HAND_OFF_ROUNDS = 3

# Successors that share GPUs by memory, locked for a hand-off: at most this many per GPU freed.
SHARES_PER_GPU = 8


class Launcher(Protocol):
    """What the node agent does for a hand-off, in the same transaction (its launcher module):
    record the attempts of the placed tasks as a launch job does, and prepare an attempt for a
    supervisor that takes it at once."""

    def launch_query(self, pairs: list[tuple[int, int]], cluster: str) -> Query: ...

    def launch_assignments(
        self, pairs: list[tuple[int, int]], rows: list[tuple], cluster: str
    ) -> tuple[list[str], list[Assignment]]: ...

    def prepare_logs(self, assignment: Assignment) -> None: ...

    def supervisor_sink(self, assignment: Assignment) -> Any: ...


@dataclass(slots=True)
class HandOff:
    """Where a node agent's batch of plain ends hands its GPUs (``node``: the agent's, whose
    ``launcher`` records the attempts), and, once it committed, what became of the attempts it
    started: ``given`` to the supervisor of the ended task whose GPUs they took (ended task id
    -> (assignment, sink)), when that one offered to take it (``ExitReport.ready``), and the
    ``rest``, for the spawner to start once the supervisors have their answers."""

    node: str
    launcher: Launcher
    given: dict[int, tuple[Assignment, str]] = field(default_factory=dict)
    rest: list[Assignment] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A successor row as ``_CANDIDATES`` locked it."""

    row: int
    task_id: int
    gpus: int
    gpu_ids: frozenset[int]
    attempt: int  # the task's attempt before it is placed
    swap: bool = False  # it takes only GPUs its own tenant's ended tasks free (``hand_on``)
    tenant: int | None = None  # a swap's tenant's id
    memory_mb: int = 0  # what it reserves on each GPU it takes, sharing it; 0: held whole
    one_for_one: bool = True  # a swap that replaces one ended task of its tenant, no more


def plain_ends(
    plain: list[ExitReport], hand: HandOff | None, *, first: Query | None = None
) -> tuple[list[tuple], list[tuple]]:
    """Record these plain ends (exits with 0 nobody asked for) and, with a ``hand``, hand
    their GPUs on to the successors on ``hand.node``; returns the rows of ``first`` (a
    statement run before the ends, in their transaction and round trip: the starts they
    carry, ``reports.started_query``) and the ended tasks as ``_SUCCEEDED`` does (attempt id,
    task id, tenant id, name, reason, node id, reason code, reason params). Runs in a
    transaction of its own (or the caller's).

    An agent confined to its node's rows (a node credential's, ``nodecredentials``) hands
    nothing on: the successors and their tenants' quotas are the control plane's, so their
    GPUs go to the next pass, which it requests."""
    if hand is None or node_scope() is not None:
        moved = fetch_together(first)[0] if first is not None else []
        return moved, _record_alone(plain)
    now = timezone.now()
    tasks = [r.task_id for r in plain]
    node = hand.node
    where = {"tasks": tasks, "now": now, "node": node}
    ready = {r.task_id for r in plain if r.ready}
    with transaction.atomic():
        *moved, ended, locked = fetch_together(
            *([first] if first is not None else []),
            Query(_SUCCEEDED, succeeded_params(plain, now, claim=False)),
            Query(_CANDIDATES, where),
        )
        # Per tenant, its tasks that ended here and that no swap has replaced yet.
        ends = Counter(row[2] for row in ended)
        for round_ in range(HAND_OFF_ROUNDS):
            if round_:  # a placement was skipped: its GPUs are free, and read again
                (locked,) = fetch_together(Query(_CANDIDATES, where))
            # Each row also carries the list's length, what is left of it and the freed GPUs.
            listed, left, freed = locked[0][5:8] if locked else (0, 0, [])
            candidates = [
                Candidate(*row[:3], frozenset(row[3]), row[4], *row[8:12]) for row in locked
            ]
            owners = {gpu: tenant for gpu, *_, tenant in freed}
            placements, unused = hand_on(
                candidates, [Freed(*row[:3]) for row in freed], node, owners, ends
            )
            if not placements:
                if ended:  # freed GPUs went to nobody
                    passes.request_pass()
                break
            # A pass too when a freed GPU went to nobody or less than half of the list is left.
            claim = bool(unused) or 2 * (left - len(placements)) < listed
            held_by = {gpu: task_id for gpu, _, _, task_id, _ in freed}
            donors = {p.task_id: held_by[p.gpus[0][0]] for p in placements}
            placed = _place(
                placements, candidates, hand, now, claim=claim, donors=donors, ready=ready
            )
            # Read only for ``one_for_one`` swaps, which all of a tenant's swaps are or none.
            ends.subtract(c.tenant for c in candidates if c.swap and c.task_id in placed)
            if len(placed) == len(placements):
                break
        else:  # GPUs still free after the last round
            passes.request_pass()
    return (moved[0] if moved else []), [row[:8] for row in ended]


def _place(
    placements: list[Placement],
    candidates: list[Candidate],
    hand: HandOff,
    now,
    *,
    claim: bool,
    donors: dict[int, int],
    ready: set[int],
) -> set[int]:
    """Place, record the attempts and drop the rows of the matched successors, claiming the
    pass flag if ``claim``, in one round trip; returns the tasks placed (a placement is skipped
    when its task is no longer pending). Once the transaction commits, the placements are
    published, the pass is queued, and each attempt goes to the supervisor of the ended task
    whose GPUs it took (``donors``: placed task id -> ended task id) if that one is ``ready``
    and has none yet, or else to the spawner (``HandOff``)."""
    node = hand.node
    placed_ids = {p.task_id for p in placements}
    attempts = {c.task_id: c.attempt + 1 for c in candidates if c.task_id in placed_ids}
    pairs = [(p.task_id, attempts[p.task_id]) for p in placements]
    placed, launched, ((took, exists),) = fetch_together(
        scheduler.place_query(placements, now),
        hand.launcher.launch_query(pairs, node),
        Query(
            _TAKEN, {"rows": [c.row for c in candidates if c.task_id in attempts], "claim": claim}
        ),
    )
    gpus = {p.task_id: [gpu for gpu, _ in p.gpus] for p in placements}
    news = [(task_id, tenant, node_id, gpus[task_id]) for task_id, _, tenant, node_id in placed]
    _, recorded = hand.launcher.launch_assignments(pairs, launched, node)

    def after_commit() -> None:
        events.publish(events.PLACEMENTS, news)
        for assignment in recorded:
            donor = donors[assignment.task_id]
            if donor in ready and donor not in hand.given:
                hand.launcher.prepare_logs(assignment)
                hand.given[donor] = (assignment, str(hand.launcher.supervisor_sink(assignment)))
            else:
                hand.rest.append(assignment)
        if took:
            passes.request_pass((took, exists))

    transaction.on_commit(after_commit)
    # Unless this statement took the flag, the pass is asked for after the commit: a flag
    # someone else holds, seen inside this transaction, belongs to a pass that may read before
    # the commit.
    if claim and not took:
        passes.request_pass()
    return {task_id for task_id, *_ in placed}


# The GPUs this batch of plain ends released on the agent's node (``released_at`` is the
# statement's own time), available and with no foreign process, each once: with its memory when
# an ended task held it whole (0 otherwise: then only shares of it go on), what the ended tasks
# held of it (shares of it take no more), one of those tasks, how many of them there were and,
# when they were all one tenant's, that tenant (a swap takes only what its own tenant's tasks
# freed). Only what the ended tasks held was never free in a pass's snapshot: the rest of a
# card they shared is a pass's to give, even once nobody holds any of it. Given whole too, a
# pass's shares and a hand-off's whole placement met on such cards, and the capacity trigger
# failed the later transaction: an agent's whole batch of ends, whose supervisors then each
# loaded Django to write their own. What an earlier round of the same hand-off gave of a card
# (``HAND_OFF_ROUNDS``; its placements are stamped with the same time) is not offered again,
# nor a card a task now holds whole: a card with nothing left to give is not listed.
# Cards others still share come first: a share goes there before it splits a card a task could
# take whole.
_FREED = """
    SELECT r.gpu_id,
           CASE WHEN r.holders = 0 AND bool_and(r.exclusive) THEN r.card_mb ELSE 0 END
               AS whole_mb,
           CASE WHEN r.held_whole THEN 0 ELSE greatest(sum(r.held_mb) - r.given_mb, 0) END
               AS shares_mb,
           min(r.task_id) AS task_id,
           CASE WHEN min(r.tenant_id) = max(r.tenant_id) THEN min(r.tenant_id) END AS tenant_id,
           count(*) AS ends, r.index
      FROM (SELECT a.gpu_id, g.memory_mb AS card_mb, a.task_id, g.index,
                   CASE WHEN a.exclusive THEN g.memory_mb ELSE a.memory_mb END AS held_mb,
                   a.exclusive,
                   (SELECT k.tenant_id FROM scheduling_task k WHERE k.id = a.task_id) AS tenant_id,
                   o.holders, o.given_mb, o.held_whole
              FROM scheduling_allocation a
              JOIN scheduling_gpu g ON g.id = a.gpu_id
              JOIN scheduling_node n ON n.id = g.node_id
              CROSS JOIN LATERAL (
                  SELECT count(*) AS holders,
                         COALESCE(sum(o.memory_mb) FILTER (WHERE o.started_at = %(now)s), 0)
                             AS given_mb,
                         COALESCE(bool_or(o.exclusive), false) AS held_whole
                    FROM scheduling_allocation o
                   WHERE o.gpu_id = a.gpu_id AND o.released_at IS NULL) o
             WHERE a.task_id = ANY((SELECT %(tasks)s::bigint[])::bigint[])
               AND a.released_at = %(now)s
               AND n.name = %(node)s AND n.state = 'available' AND g.state = 'available'
               AND g.foreign_memory_mb = 0) r
     GROUP BY r.gpu_id, r.card_mb, r.index, r.holders, r.given_mb, r.held_whole
    HAVING (r.holders = 0 AND bool_and(r.exclusive))
        OR (NOT r.held_whole AND sum(r.held_mb) > r.given_mb)
"""

# The first successors of the newest list, by rank, that may take some of those GPUs and are still
# pending, locked (those another agent or a pass holds are skipped): of those that hold their GPUs
# whole, at most one per GPU freed whole (``entire``); of those that share them, at most
# ``SHARES_PER_GPU`` per GPU freed (``sharing``); of swaps, for what its own tenant's tasks freed
# (whole, a GPU they held whole), at most one per task of its that ended or per GPU they freed,
# whichever is more (``swaps``: ``hand_on`` holds a ``one_for_one`` swap to the first; tenant by
# tenant: taken in rank order with the others, a tenant's swaps ranked first used up the limit while
# the GPUs of the others went to nobody); none that needs more GPUs, or more of one, than were freed
# (for it), which would take the place of one that fits. Each with how many the list had and has
# left, the freed GPUs (as _FREED), whether it swaps, its tenant and the memory it reserves on each
# GPU (0: it holds them whole). Every row of another table is looked up by its key in a subquery of
# its own: as joins, with the statistics of tables emptied and filled within a minute, the planner
# looped over every pending task for each successor. What is left of the list is counted once, not
# for each row gone through (those skipped as locked too). Compacted: see ``db.compact``.
_CANDIDATES = compact(f"""
    WITH freed AS ({_FREED}),
    newest AS (SELECT max(generation) AS generation FROM scheduling_successor),
    mine AS (SELECT tenant_id, count(*) AS n, sum(ends) AS ends,
                    array_agg(gpu_id::integer) AS gpus, max(shares_mb) AS most_mb,
                    count(*) FILTER (WHERE whole_mb > 0 AND shares_mb >= whole_mb) AS whole
               FROM freed WHERE tenant_id IS NOT NULL GROUP BY tenant_id),
    entire AS (SELECT s.id FROM scheduling_successor s
               WHERE s.generation = (SELECT generation FROM newest) AND s.swap_tenant IS NULL
                 AND s.memory_mb = 0
                 AND s.gpus <= (SELECT count(*) FROM freed WHERE whole_mb > 0)
                 AND s.gpu_ids && ARRAY(SELECT gpu_id::integer FROM freed WHERE whole_mb > 0)
                 AND (SELECT t.state = 'pending' AND t.hold_reason = ''
                        FROM scheduling_task t WHERE t.id = s.task_id)
               ORDER BY s.rank
               LIMIT (SELECT count(*) FROM freed WHERE whole_mb > 0)
                 FOR UPDATE SKIP LOCKED),
    sharing AS (SELECT s.id FROM scheduling_successor s
                 WHERE s.generation = (SELECT generation FROM newest)
                   AND s.swap_tenant IS NULL AND s.memory_mb > 0
                   AND s.memory_mb <= (SELECT max(shares_mb) FROM freed)
                   AND s.gpus <= (SELECT count(*) FROM freed)
                   AND s.gpu_ids && ARRAY(SELECT gpu_id::integer FROM freed)
                   AND (SELECT t.state = 'pending' AND t.hold_reason = ''
                          FROM scheduling_task t WHERE t.id = s.task_id)
                 ORDER BY s.rank
                 LIMIT {SHARES_PER_GPU} * (SELECT count(*) FROM freed)
                   FOR UPDATE SKIP LOCKED),
    swaps AS (SELECT c.id FROM mine CROSS JOIN LATERAL (
                SELECT s.id FROM scheduling_successor s
                 WHERE s.generation = (SELECT generation FROM newest)
                   AND s.swap_tenant = mine.tenant_id AND s.gpu_ids && mine.gpus
                   AND CASE WHEN s.memory_mb = 0 THEN s.gpus <= mine.whole
                            ELSE s.gpus <= mine.n AND s.memory_mb <= mine.most_mb END
                   AND (SELECT t.state = 'pending' AND t.hold_reason = ''
                          FROM scheduling_task t WHERE t.id = s.task_id)
                 ORDER BY s.rank
                 LIMIT greatest(mine.ends, mine.n)
                   FOR UPDATE SKIP LOCKED) c)
    SELECT s.id, s.task_id, s.gpus, s.gpu_ids,
           (SELECT t.attempt FROM scheduling_task t WHERE t.id = s.task_id), s.listed,
           (SELECT count(*) FROM scheduling_successor o
             WHERE o.generation = (SELECT generation FROM newest)),
           ARRAY(SELECT ARRAY[gpu_id, whole_mb, shares_mb, task_id, tenant_id] FROM freed
                  ORDER BY whole_mb > 0, index),
           s.swap_tenant IS NOT NULL, s.swap_tenant, s.memory_mb, s.one_for_one
      FROM scheduling_successor s
     WHERE s.id IN (SELECT id FROM entire UNION ALL SELECT id FROM sharing
                    UNION ALL SELECT id FROM swaps)
     ORDER BY s.rank
""")  # noqa: S608 - constant text

# The placed successors leave the list; the pass flag is claimed when ``claim`` says so. The
# array through a scalar subquery, as in ``_SUCCEEDED`` (the cast keeps it an array, not a row
# set for ANY).
_TAKEN = f"""
    WITH gone AS (DELETE FROM scheduling_successor
                   WHERE id = ANY((SELECT %(rows)s::bigint[])::bigint[])),
    {passes.claim_cte("%(claim)s")}
    SELECT {passes.CLAIMED}
"""  # noqa: S608 - constant text


def _record_alone(plain: list[ExitReport]) -> list[tuple]:
    """Record plain ends in one statement (``_SUCCEEDED``), which also claims the pass flag
    when it commits by itself; returns the ended tasks (its first eight columns)."""
    alone = not connection.in_atomic_block  # the statement commits by itself
    with server_bound_cursor() as cursor:
        cursor.execute(_SUCCEEDED, succeeded_params(plain, timezone.now(), claim=alone))
        rows = cursor.fetchall()
    if rows:
        # Their GPUs are free: committed by itself, the statement claimed the flag.
        passes.request_pass(rows[0][8:] if alone else None)
    return [row[:8] for row in rows]


def _notes_data(note: str) -> str:
    """A note's reasons as ``reason_params``' "notes" (JSON), ``{}`` for none."""
    notes = [reason.as_data() for reason in agent_notes.of_note(note)]
    return json.dumps({"notes": notes} if notes else {})


def succeeded_params(plain: list[ExitReport], now, *, claim: bool) -> dict:
    """``_SUCCEEDED``'s parameters for these plain ends, stamped ``now``."""
    return {
        "tasks": [r.task_id for r in plain],
        "numbers": [r.attempt_no for r in plain],
        "notes": [r.note for r in plain],
        # The notes as data (``agent_notes``): the parameters' "notes", or nothing.
        "notes_data": [_notes_data(r.note) for r in plain],
        "now": now,
        "claim": claim,
    }


# Exits with 0 of running tasks whose attempt nobody asked to stop: the task succeeds and its
# GPUs are released (``transitions.moved``; the trigger of migration 0010 adds their use to the
# fair-share counters).
# The arrays are read through scalar subqueries, as ``lifecycle._LAUNCH``'s: seeing their values
# (one or two ends), the planner costed each call's own plan below the statement's generic one
# and planned every call again (pg_stat_statements: 744 plans in 744 calls; with three other
# statements like it, a third of PostgreSQL's time in the throughput bench). The tasks are
# also matched to the array with ANY, which the primary key's index serves: the generic plan
# counts ten rows for an array it cannot see, and with no statistics yet it took a scan of
# every running task to be cheaper than ten lookups by key
# (tests/nodeagent/launcher/test_report_plans.py).
# When it released some and ``claim`` is set (it commits by itself), it also claims the pass
# flag (``passes.claim_cte``), which would otherwise be a statement of its own right after
# this one.
_SUCCEEDING = transitions.moved(
    "k",
    TaskState.RUNNING,
    TaskState.SUCCEEDED,
    source="a",
    where="k.id = a.task_id",
    reason="concat_ws('; ', 'exited with 0', NULLIF(a.note, ''))",
    code="'exited'",
    # The node agent's note (limits hit, output lost) as reasons (``agent_notes``).
    params="jsonb_build_object('exit_code', 0) || a.notes_data",
    sets="exit_code = 0",
    returning="a.id AS attempt_id, k.tenant_id, k.name, k.reason, k.node_id",
)
_SUCCEEDED = f"""
    WITH r AS (SELECT * FROM unnest((SELECT %(tasks)s::bigint[]), (SELECT %(numbers)s::integer[]),
                                    (SELECT %(notes)s::text[]), (SELECT %(notes_data)s::jsonb[]))
                          AS r(task_id, number, note, notes_data)),
    locked AS (SELECT k.id, k.attempt FROM scheduling_task k JOIN r ON r.task_id = k.id
                WHERE k.id = ANY((SELECT %(tasks)s::bigint[])::bigint[])
                  AND k.attempt = r.number AND k.state IS NOT DISTINCT FROM 'running'
                -- NO KEY: other transactions' foreign keys to these tasks (a pass's commit)
                -- pass; FOR UPDATE held them until our commit, and deadlocked with them.
                ORDER BY k.id FOR NO KEY UPDATE OF k),
    a AS (UPDATE scheduling_taskattempt a
             SET exit_code = 0, outcome = 'succeeded', ended_at = %(now)s
            FROM locked, r
           WHERE a.task_id = locked.id AND a.number = locked.attempt AND r.task_id = locked.id
             AND a.outcome = '' AND a.stop_requested = ''
       RETURNING a.id, a.task_id, r.note, r.notes_data),
    {_SUCCEEDING},
    {passes.claim_cte("%(claim)s AND EXISTS (SELECT 1 FROM k)")}
    SELECT attempt_id, id, tenant_id, name, reason, node_id, event_code, event_params,
           {passes.CLAIMED} FROM k
"""  # noqa: S608 - constant text
