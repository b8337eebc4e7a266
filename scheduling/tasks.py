"""django-q2 task functions: they only dispatch to services and return quickly."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from scheduling import services
from scheduling.config import load_config


def mark_silent_nodes() -> list[str]:
    """Backstop schedule (every minute): nodes whose agent went quiet become offline."""
    estate = load_config(settings.GPUPLATFORM_CONFIG)
    return services.nodes_mark_silent(
        offline_after=timedelta(seconds=estate.heartbeat.offline_after_s)
    )
