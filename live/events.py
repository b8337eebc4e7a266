"""The event plane: small JSON events the services publish to websocket groups on commit.

Groups: ``live.ops`` (operators: everything) and ``live.tenant.<id>`` (a tenant's members: that
tenant's tasks and the samples of GPUs its tasks hold). A publisher never learns who listens and
never waits for a browser: a send is one INSERT of the messages into channels_postgres' table (the
trigger NOTIFYs the web processes), or an in-process group_send with the in-memory layer.

Every helper registers its send with ``transaction.on_commit``: a browser never hears of a change
that rolled back. Call sites that change many rows publish once, with a batch.

Nobody watching costs nothing: each connection that publishes remembers which groups have
members (the INSERT returns them) and sends nothing to the others, so an estate nobody watches
makes no statement per event (otherwise every task's events would each cost an INSERT that
finds no group row). A socket joining a group inserts its row
in channels_postgres' group table, whose trigger (live migration 0001) NOTIFYs
``LISTENERS_CHANNEL``; every publishing connection LISTENs there and forgets what it
remembered. The notification reaches a publisher before its next COMMIT returns (PostgreSQL
delivers it just before ReadyForQuery), so an event committed after the page's own catch-up
read (which follows the join) is sent; one committed before is in that read.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from gpuplatform.db import server_bound_cursor

logger = logging.getLogger(__name__)

OPS = "live.ops"
# The handler name consumers implement (channels maps "live.batch" to live_batch).
MESSAGE_TYPE = "live.batch"
# Seconds an undelivered message stays in channels_postgres' table (its own default is 60).
EXPIRY_S = 60
# Per-tenant pending reasons in one event at most; the rest only counted (a page re-reads).
REASONS_PER_EVENT = 500


def tenant_group(tenant_id: int) -> str:
    return f"live.tenant.{tenant_id}"


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None


# --- Building events -----------------------------------------------------------------------------


def task_event(task: Any) -> dict:
    """A task's state as the dashboard and portal show it (no command, no environment)."""
    return {
        "kind": "task",
        "id": task.pk,
        "tenant_id": task.tenant_id,
        "name": task.name,
        "state": str(task.state),
        "reason": task.reason,
        # The reason as data: each socket renders it in its reader's language (consumers).
        "reason_code": getattr(task, "reason_code", ""),
        "reason_params": getattr(task, "reason_params", None) or {},
        "node_id": task.node_id,
        "at": time.time(),
    }


def gpu_event(gpu: Any) -> dict:
    return {
        "kind": "gpu",
        "id": gpu.pk,
        "node_id": gpu.node_id,
        "index": gpu.index,
        "state": str(gpu.state),
        "reason": gpu.state_reason,
        "at": time.time(),
    }


def node_event(node: Any) -> dict:
    return {
        "kind": "node",
        "id": node.pk,
        "name": node.name,
        "state": str(node.state),
        "reason": node.state_reason,
        "last_heartbeat": _ts(node.last_heartbeat),
        "at": time.time(),
    }


def alert_event(alert: Any) -> dict:
    return {
        "kind": "alert",
        "id": alert.pk,
        "alert_kind": alert.kind,
        "severity": alert.severity,
        "message": alert.message,
        "open": alert.resolved_at is None,
        "gpu_id": alert.gpu_id,
        "node_id": alert.node_id,
        "task_id": alert.task_id,
        "opened_at": _ts(alert.opened_at),
        "at": time.time(),
    }


# --- Publishing ----------------------------------------------------------------------------------


def publish(events: Iterable[tuple[int | None, dict]]) -> None:
    """Send each ``(tenant_id, event)`` to operators, and to the tenant's members when
    ``tenant_id`` is set, once the current transaction commits (at once outside one)."""
    by_group: dict[str, list[dict]] = defaultdict(list)
    for tenant_id, event in events:
        by_group[OPS].append(event)
        if tenant_id is not None:
            by_group[tenant_group(tenant_id)].append(event)
    if by_group:
        transaction.on_commit(lambda: send(by_group))


def publish_tasks(tasks: Iterable[Any]) -> None:
    publish((task.tenant_id, task_event(task)) for task in tasks)


def publish_gpus(gpus: Iterable[Any]) -> None:
    publish((None, gpu_event(gpu)) for gpu in gpus)


def publish_nodes(nodes: Iterable[Any]) -> None:
    publish((None, node_event(node)) for node in nodes)


def publish_alerts(alerts: Iterable[Any]) -> None:
    # Alerts name GPUs, nodes and tasks of any tenant: operators only.
    publish((None, alert_event(alert)) for alert in alerts)


def publish_placements(rows: Iterable[tuple[int, int, int, list[int]]]) -> None:
    """Tasks a pass placed, as (task id, tenant id, node id, GPU ids)."""
    now = time.time()
    publish(
        (
            tenant_id,
            {
                "kind": "task",
                "id": task_id,
                "tenant_id": tenant_id,
                "state": "scheduled",
                "reason": "",
                "node_id": node_id,
                "gpu_ids": gpu_ids,
                "at": now,
            },
        )
        for task_id, tenant_id, node_id, gpu_ids in rows
    )


def publish_scheduler(figures: Mapping) -> None:
    """A pass's figures (last_pass_at, last_pass_ms, placed, preempted, waiting), for
    operators."""
    publish([(None, {"kind": "scheduler", **figures, "at": time.time()})])


def publish_reasons(rows: Iterable[tuple]) -> None:
    """The pending reasons a pass changed, as (task id, tenant id, reason, its code, its
    parameters), one event per tenant; each reader's socket renders them in its language."""
    per_tenant: dict[int, list[list]] = defaultdict(list)
    for task_id, tenant_id, reason, *data in rows:
        per_tenant[tenant_id].append([task_id, reason, *data])
    now = time.time()
    events: list[tuple[int | None, dict]] = []
    for tenant_id, reasons in per_tenant.items():
        event = {
            "kind": "reasons",
            "tenant_id": tenant_id,
            "reasons": reasons[:REASONS_PER_EVENT],
            "more": max(0, len(reasons) - REASONS_PER_EVENT),
            "at": now,
        }
        events.append((tenant_id, event))
    publish(events)


def publish_samples(
    *,
    node_id: int,
    samples: Iterable[Any],
    tenants_by_gpu: Mapping[int, Iterable[int]] | None = None,
) -> None:
    """One node's GPU samples of one tick: all of them to operators, and each tenant the
    samples of the GPUs its running tasks hold. ``samples`` are telemetry's stored GpuSample
    rows (gpu_id, ``at`` a datetime), its readings (gpu_uuid, ``at`` in epoch seconds) or
    mappings with those keys; the metrics are util_gpu, memory_used_mb, memory_total_mb,
    temperature_c and power_w. Sent at once: a sample is not part of a transaction."""
    samples = list(samples)
    ids: dict[str, int] = {}
    if tenants_by_gpu is None or any(_field(sample, "gpu_id") is None for sample in samples):
        # Whoever holds the node's GPUs, read as the sampler reads it each tick.
        from scheduling.models import Node
        from telemetry.services import gpu_holders

        holders = gpu_holders(node=Node(pk=node_id))
        ids = {uuid: holder.gpu_id for uuid, holder in holders.items()}
        if tenants_by_gpu is None:
            tenants_by_gpu = {holder.gpu_id: holder.tenant_ids for holder in holders.values()}
    rows = []
    for sample in samples:
        gpu_id = _field(sample, "gpu_id") or ids.get(_field(sample, "gpu_uuid"))
        if gpu_id is None:
            continue
        at = _field(sample, "at")
        rows.append(
            [
                gpu_id,
                at.timestamp() if isinstance(at, datetime) else at,
                _field(sample, "util_gpu"),
                _field(sample, "memory_used_mb"),
                _field(sample, "memory_total_mb"),
                _field(sample, "temperature_c"),
                _field(sample, "power_w"),
            ]
        )
    if not rows:
        return
    by_group: dict[str, list[dict]] = {OPS: [sample_event(node_id, rows)]}
    for tenant_id in {t for tenants in tenants_by_gpu.values() for t in tenants}:
        mine = [row for row in rows if tenant_id in tenants_by_gpu.get(row[0], ())]
        by_group[tenant_group(tenant_id)] = [sample_event(node_id, mine)]
    send(by_group)


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, Mapping) else getattr(sample, name, None)


SAMPLE_FIELDS = ["gpu_id", "at", "util", "mem_used_mb", "mem_total_mb", "temp_c", "power_w"]


def sample_event(node_id: int, rows: list[list]) -> dict:
    # Rows, not objects: a tick of 8 GPUs stays well under NOTIFY's 8,000-byte payload.
    return {"kind": "samples", "node_id": node_id, "fields": SAMPLE_FIELDS, "rows": rows}


def send(by_group: Mapping[str, list[dict]]) -> None:
    """Send each group its events as one message. Never raises: a lost live event must not
    fail the change it reports (the page catches up from the database)."""
    layer = get_channel_layer()
    if layer is None:
        return
    messages = {
        group: {"type": MESSAGE_TYPE, "events": events} for group, events in by_group.items()
    }
    try:
        if settings.CHANNEL_LAYER == "postgres":
            _send_postgres(layer, messages)
        else:
            for group, message in messages.items():
                # In-process layer: an event loop per send is wasted on a group nobody is in.
                if getattr(layer, "groups", {}).get(group):
                    async_to_sync(layer.group_send)(group, message)
    except (DatabaseError, OSError, RuntimeError):
        logger.exception("live events not sent")


# channels_postgres' own group_send opens an asyncio connection pool bound to the event loop of
# its first call; a sync caller (the node agent, a django-q2 worker) gets a new loop from each
# async_to_sync, so it would reuse a pool tied to a dead loop. One INSERT on this thread's own
# connection does the same job for every group at once: the table's trigger NOTIFYs listeners.
# It also returns the groups that have members now (what the connection then remembers).
_INSERT = """
    WITH sent AS (
        INSERT INTO channels_postgres_message (channel, message, expire)
        SELECT DISTINCT ON (v.n, g.channel)
               g.channel, v.message, now() + make_interval(secs => %s::float8)
          FROM unnest(%s::text[], %s::bytea[]) WITH ORDINALITY AS v(group_key, message, n)
          JOIN channels_postgres_groupchannel AS g ON g.group_key = v.group_key
         ORDER BY v.n, g.channel
     RETURNING 1)
    SELECT ARRAY(SELECT DISTINCT group_key FROM channels_postgres_groupchannel)
"""
# Notified by live migration 0001's trigger whenever a socket joins a group.
LISTENERS_CHANNEL = "gpuplatform_live_groups"


class _Listeners:
    """What one publishing connection knows of the groups that have members: ``groups`` is
    None until an INSERT told it, and again after a join was notified; ``joins`` counts the
    notifications, so an answer that raced one is not kept."""

    __slots__ = ("groups", "joins")

    def __init__(self) -> None:
        self.groups: frozenset[str] | None = None
        self.joins = 0

    def notified(self, notify: Any) -> None:
        if notify.channel == LISTENERS_CHANNEL:
            self.joins += 1
            self.groups = None


# Per psycopg connection: a new connection (a reconnect, a pooled one) starts knowing nothing.
_listeners: WeakKeyDictionary[Any, _Listeners] = WeakKeyDictionary()


def _listeners_of_connection() -> _Listeners | None:
    """The connection's listeners, LISTENing first if it does not yet. None inside a
    transaction: a LISTEN there would count only from its commit, so such a send just INSERTs
    (sends run on commit; samples outside any transaction)."""
    if connection.in_atomic_block:
        return None
    connection.ensure_connection()
    raw = connection.connection
    known = _listeners.get(raw)
    if known is None:
        known = _Listeners()
        raw.add_notify_handler(known.notified)
        with connection.cursor() as cursor:
            cursor.execute(f"LISTEN {LISTENERS_CHANNEL}")
        _listeners[raw] = known
    else:
        # What the server sent while the connection was idle (a join notified since its last
        # statement): read from the socket without a round trip, so it counts for this send.
        pgconn = raw.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error:
            return None  # a broken connection: the INSERT fails as every statement would
        while notify := pgconn.notifies():
            pgconn.notify_handler(notify)
    return known


def _send_postgres(layer: Any, messages: Mapping[str, dict]) -> None:
    listeners = _listeners_of_connection()
    by_key = {layer._group_key(group): message for group, message in messages.items()}
    if listeners is not None and listeners.groups is not None:
        by_key = {key: message for key, message in by_key.items() if key in listeners.groups}
        if not by_key:
            return  # nobody in any of these groups: no statement at all
    blobs = [layer.serialize(message) for message in by_key.values()]
    joins = listeners.joins if listeners is not None else 0
    # Bound on the server: Django's client-side binding escapes every byte of the messages in
    # Python, which was most of what publishing cost the node agent and the scheduler.
    with server_bound_cursor() as cursor:
        cursor.execute(_INSERT, [EXPIRY_S, list(by_key), blobs])
        (groups,) = cursor.fetchone()
    if listeners is not None and listeners.joins == joins:
        listeners.groups = frozenset(groups)
