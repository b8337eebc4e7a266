"""Domain events: what a service changed, handed to subscribers once the transaction commits.

The domain (scheduling, telemetry, monitoring) publishes here and never imports the layers that
show its changes; ``live`` subscribes in its ``AppConfig.ready``. A topic nobody subscribed to
costs nothing. A subscriber's failure is logged and never fails the change it reports.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from django.db import transaction

logger = logging.getLogger(__name__)

Handler = Callable[..., None]

TASKS = "tasks"  # task-like objects (id, tenant_id, state, reason, node_id, ...)
GPUS = "gpus"  # GPU objects or a queryset of them
NODES = "nodes"  # Node objects or a queryset of them
ALERTS = "alerts"  # Alert objects
PLACEMENTS = "placements"  # (task id, tenant id, node id, [GPU ids]) a placement wrote
SCHEDULER = "scheduler"  # one pass's figures
REASONS = "reasons"  # (task id, tenant id, pending reason) a pass changed
SAMPLES = "samples"  # a node's GPU samples of one tick (keywords node_id, samples, ...)

_subscribers: dict[str, list[Handler]] = defaultdict(list)


def subscribe(topic: str, handler: Handler) -> None:
    if handler not in _subscribers[topic]:
        _subscribers[topic].append(handler)


def subscribed(topic: str) -> bool:
    return bool(_subscribers.get(topic))


def publish(topic: str, *args: object, **kwargs: object) -> None:
    """Call ``topic``'s subscribers with these arguments when the current transaction commits
    (at once outside one); nothing when the transaction rolls back."""
    handlers = _subscribers.get(topic)
    if not handlers:
        return
    for handler in list(handlers):
        transaction.on_commit(_guarded(handler, args, kwargs), robust=True)


def _guarded(handler: Handler, args: tuple, kwargs: dict) -> Callable[[], None]:
    def call() -> None:
        try:
            handler(*args, **kwargs)
        except Exception:  # a lost live event must not fail the change it reports
            logger.exception("event subscriber %r failed", handler)

    return call
