"""Domain events: what a service changed, told to whoever subscribed.

The domain (scheduling, telemetry, monitoring) and the node agent publish here and never import
the layers that show their changes: ``live`` subscribes in its ``AppConfig.ready``. Subscribers
are called at once, inside the publisher's transaction, with the objects as they are now, and
must send nothing before it commits (``live`` registers its sends with
``transaction.on_commit``), so nobody hears of a change that rolled back. A topic nobody
subscribed to costs a dictionary look-up.
"""

from __future__ import annotations

from collections.abc import Callable

Handler = Callable[..., None]

# Topics and what their subscribers are given.
TASKS = "tasks"  # task-like objects: pk, tenant_id, name, state, reason, node_id
GPUS = "gpus"  # GPU objects (or a queryset of them)
NODES = "nodes"  # Node objects (or a queryset of them)
ALERTS = "alerts"  # Alert objects
PLACEMENTS = "placements"  # (task id, tenant id, node id, [GPU ids]) of new placements
SCHEDULER = "scheduler"  # a pass's figures, as a mapping
# (task id, tenant id, pending reason, its code, its parameters) a pass changed
REASONS = "reasons"
SAMPLES = "samples"  # keywords node_id, samples, tenants_by_gpu: one node's tick
TOPICS = (TASKS, GPUS, NODES, ALERTS, PLACEMENTS, SCHEDULER, REASONS, SAMPLES)

_subscribers: dict[str, list[Handler]] = {}


def subscribe(topic: str, handler: Handler) -> None:
    handlers = _subscribers.setdefault(topic, [])
    if handler not in handlers:
        handlers.append(handler)


def publish(topic: str, *args: object, **kwargs: object) -> None:
    for handler in _subscribers.get(topic, ()):
        handler(*args, **kwargs)
