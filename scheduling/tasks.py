"""django-q2 task functions: they only dispatch to services and return quickly."""

from __future__ import annotations

from datetime import timedelta

from scheduling import estate, scheduler, services


def mark_silent_nodes() -> list[str]:
    """Backstop schedule (every minute): nodes whose agent went quiet become offline."""
    offline_after = estate.config().heartbeat.offline_after_s
    return services.nodes_mark_silent(offline_after=timedelta(seconds=offline_after))


def run_pass() -> dict:
    """One scheduling pass (on request, and every minute as a backstop)."""
    result = scheduler.schedule_pass()
    return {"placed": len(result.placed), "preempted": len(result.preempted),
            "waiting": result.waiting, "ms": round(result.ms, 1)}  # fmt: skip
