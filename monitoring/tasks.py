"""django-q2 task functions for monitoring: they only dispatch and return quickly."""

from __future__ import annotations

from monitoring import webhook


def webhook_send(alert_id: int, event: str, attempt: int) -> str:
    return webhook.send(alert_id, event, attempt)
