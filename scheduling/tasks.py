"""django-q2 task functions: they only dispatch to services and return quickly."""

from __future__ import annotations

import logging
from datetime import timedelta

from scheduling import controls, estate, passes, scheduler, services

logger = logging.getLogger(__name__)


def mark_silent_nodes() -> dict:
    """Backstop schedule (every minute): nodes whose agent went quiet become offline, and
    their tasks, once the node has been silent for ``lost_after``, are lost and requeued."""
    heartbeat = estate.config().heartbeat
    silent = services.nodes_mark_silent(offline_after=timedelta(seconds=heartbeat.offline_after_s))
    lost = controls.requeue_tasks_of_silent_nodes(timedelta(seconds=heartbeat.lost_after_s))
    return {"silent_nodes": silent, "lost_tasks": lost}


def run_pass() -> dict:
    """One scheduling pass (on request, and every minute as a backstop), or, while tasks wait
    and no GPU is idle, the same pass queued for a moment later (``passes.defer_while_busy``)."""
    due = passes.defer_while_busy(estate.config().scheduling.busy_pass_gap_ms)
    if due is not None:
        return {"deferred_to": due.isoformat()}
    result = scheduler.schedule_pass()
    return {"placed": len(result.placed), "preempted": len(result.preempted),
            "waiting": result.waiting, "ms": round(result.ms, 1)}  # fmt: skip


def run_pass_if_stalled(started: int) -> dict:
    """A pass queued when ``started`` passes had started, checked a moment later
    (``passes._watch_for_stall``): if it never started (the scheduler that took it died), run
    one here."""
    if not passes.stalled(started):
        return {}
    logger.warning("a queued scheduling pass never started (its scheduler gone?): running it")
    return run_pass()
