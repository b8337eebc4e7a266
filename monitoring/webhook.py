"""Optional webhook: each alert that opens or resolves is POSTed as JSON to
``telemetry.webhook_url`` (configs/scheduler.yaml), retried with backoff.

Sent from the scheduler's django-q2 cluster after the alert's transaction commits, never from
the code that raised it: a slow or dead receiver delays nobody. A failed POST is re-queued as a
delayed row in django-q2's ORM broker (see ``scheduling.passes.DelayedOrm``), so retries
survive restarts; after ``ATTEMPTS`` tries it is logged and dropped.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from monitoring.models import Alert
from scheduling import estate
from scheduling.config import ConfigError
from scheduling.passes import DelayedOrm, scheduler_cluster

logger = logging.getLogger(__name__)

ATTEMPTS = 5
TIMEOUT_S = 5
BACKOFF_S = (10, 30, 120, 600)  # before the 2nd, 3rd, 4th and 5th attempt


def webhook_url() -> str:
    try:
        return estate.config().telemetry.webhook_url
    except ConfigError:
        return ""


def notify(*, alert_ids: list[int], event: str) -> None:
    """Queue a POST per alert once the current transaction commits (if a webhook is set)."""
    if alert_ids and webhook_url():
        transaction.on_commit(lambda: [_enqueue(pk, event, 1) for pk in alert_ids])


def _enqueue(alert_id: int, event: str, attempt: int, delay_s: int = 0) -> None:
    kwargs: dict = {"cluster": scheduler_cluster(), "task_name": f"alert-webhook-{alert_id}"}
    if delay_s:
        kwargs.update(
            sync=False,
            broker=DelayedOrm(
                list_key=settings.Q_CLUSTER["name"],
                due=timezone.now() + timedelta(seconds=delay_s),
            ),
        )
    async_task("monitoring.tasks.webhook_send", alert_id, event, attempt, **kwargs)


def payload(alert: Alert, event: str) -> dict:
    node = alert.node or (alert.gpu.node if alert.gpu else None)
    return {
        "event": event,
        "alert": {
            "id": alert.pk,
            "kind": alert.kind,
            "severity": alert.severity,
            "message": alert.message,
            "gpu": alert.gpu.uuid if alert.gpu else None,
            "node": node.name if node else None,
            "task": alert.task_id,
            "tenant": alert.task.tenant.name if alert.task else None,
            "opened_at": alert.opened_at.isoformat(),
            "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        },
    }


def send(alert_id: int, event: str, attempt: int) -> str:
    url = webhook_url()
    alert = (
        Alert.objects.select_related("gpu__node", "node", "task__tenant")
        .filter(pk=alert_id)
        .first()
    )
    if not url or alert is None:
        return "nothing to send"
    body = json.dumps(payload(alert, event)).encode()
    request = urllib.request.Request(  # noqa: S310 - the URL is validated as http(s)
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            status = response.status
    except (urllib.error.URLError, OSError) as exc:
        problem = str(getattr(exc, "reason", exc))
    else:
        return f"sent ({status})"
    if attempt >= ATTEMPTS:
        logger.error("alert %s webhook dropped after %d attempts: %s", alert_id, attempt, problem)
        return f"dropped: {problem}"
    delay = BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]
    logger.warning("alert %s webhook failed (%s); retry in %d s", alert_id, problem, delay)
    _enqueue(alert_id, event, attempt + 1, delay)
    return f"retrying: {problem}"
