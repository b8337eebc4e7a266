"""Opening and closing alerts. Callers say what they observe now; these keep one open alert per
subject and close what is no longer observed."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from gpuplatform import events
from monitoring import webhook
from monitoring.models import Alert
from scheduling.models import GPU, Node, Task

logger = logging.getLogger(__name__)


@transaction.atomic
def alert_raise(
    *,
    kind: str,
    severity: str,
    message: str,
    gpu: GPU | None = None,
    task: Task | None = None,
    node: Node | None = None,
) -> Alert:
    """Open an alert, or refresh the open one for the same subject (message, severity, seen).

    A GPU's alert is filed under its node too (``node`` defaults to ``gpu.node``), so that
    ``alerts_resolve_except(node=...)`` finds it; pass the same subject to resolve it.
    """
    subject = _subject(gpu=gpu, task=task, node=node)
    now = timezone.now()
    alert = _open(kind, subject).select_for_update().first()
    if alert is None:
        try:
            # A savepoint: a concurrent raiser may have opened it since we looked.
            with transaction.atomic():
                alert = Alert.objects.create(
                    kind=kind,
                    severity=severity,
                    message=message,
                    opened_at=now,
                    last_seen_at=now,
                    **subject,
                )
        except IntegrityError:
            alert = _open(kind, subject).select_for_update().first()
            if alert is None:  # not the one-open-alert constraint: a real error
                raise
        else:
            logger.warning("alert opened: %s", alert)
            events.publish(events.ALERTS, [alert])
            webhook.notify(alert_ids=[alert.pk], event="opened")
            return alert
    changed = (alert.severity, alert.message) != (severity, message)
    alert.severity = severity
    alert.message = message
    alert.last_seen_at = now
    alert.save(update_fields=["severity", "message", "last_seen_at"])
    if changed:  # a refresh that only says "still so" (every sampling tick) is news to no page
        events.publish(events.ALERTS, [alert])
    return alert


@transaction.atomic
def alert_resolve(
    *, kind: str, gpu: GPU | None = None, task: Task | None = None, node: Node | None = None
) -> int:
    """Resolve the open alert of this kind for exactly this subject; returns 0 or 1."""
    return _resolve(_open(kind, _subject(gpu=gpu, task=task, node=node)))


def alerts_resolve_except(
    *,
    kind: str,
    keep: Collection[tuple[int | None, int | None]],
    node: Node | None = None,
) -> int:
    """Resolve the open alerts of ``kind`` whose (gpu_id, task_id) is not in ``keep``.

    The caller states what it observes now ("these are the current overuses") and everything
    else of that kind closes. With ``node``, only that node's alerts (its own or its GPUs') are
    considered, so one node agent never closes another node's alerts. Returns how many closed.
    """
    return alerts_resolve_except_each(keep={kind: keep}, node=node)


def alerts_resolve_except_each(
    *,
    keep: Mapping[str, Collection[tuple[int | None, int | None]]],
    node: Node | None = None,
) -> int:
    """``alerts_resolve_except`` for several kinds at once (``keep`` maps each kind to what it
    keeps), in one query when nothing is stale: a sampling tick checks two kinds."""
    alerts = Alert.objects.filter(kind__in=keep, resolved_at__isnull=True)
    if node is not None:
        alerts = alerts.filter(Q(node=node) | Q(gpu__node=node))
    stale = [
        pk
        for pk, kind, gpu_id, task_id in alerts.values_list("pk", "kind", "gpu_id", "task_id")
        if (gpu_id, task_id) not in keep[kind]
    ]
    if not stale:  # the usual case, every sampling tick: no transaction, no second query
        return 0
    with transaction.atomic():
        return _resolve(Alert.objects.filter(pk__in=stale, resolved_at__isnull=True))


@transaction.atomic
def alerts_resolve(*, alerts: QuerySet[Alert]) -> int:
    """Resolve these alerts (an operator's decision); already resolved ones stay as they were."""
    return _resolve(alerts)


def _subject(*, gpu: GPU | None, task: Task | None, node: Node | None) -> dict[str, int | None]:
    if gpu is not None:
        if node is not None and node.pk != gpu.node_id:
            raise ValueError(f"GPU {gpu} is not on node {node}")
        node_id = gpu.node_id
    else:
        node_id = node.pk if node is not None else None
    return {
        "gpu_id": gpu.pk if gpu is not None else None,
        "task_id": task.pk if task is not None else None,
        "node_id": node_id,
    }


def _open(kind: str, subject: dict[str, int | None]) -> QuerySet[Alert]:
    # filter(x_id=None) is "IS NULL", matching how the unique constraint treats NULLs.
    return Alert.objects.filter(kind=kind, resolved_at__isnull=True, **subject)


def _resolve(alerts: QuerySet[Alert]) -> int:
    # One conditional UPDATE: an alert resolved concurrently is not resolved (or counted) twice.
    # The ids first: the webhook and the live dashboard are told which alerts closed.
    rows = list(alerts.filter(resolved_at__isnull=True).order_by("pk"))
    now = timezone.now()
    count = Alert.objects.filter(
        pk__in=[alert.pk for alert in rows], resolved_at__isnull=True
    ).update(resolved_at=now)
    webhook.notify(alert_ids=[alert.pk for alert in rows], event="resolved")
    if count:
        logger.info("%d alert(s) resolved", count)
        for alert in rows:
            alert.resolved_at = now
        events.publish(events.ALERTS, rows)  # one message
    return count
