"""The jobs the control plane queues for a node (``scheduling.controls``), run by its agent
(``jobs.NodeJobs``, with ``node`` its own name) or inline where jobs run inline (tests):
each only dispatches and returns."""

from __future__ import annotations

from nodeagent.launcher import lifecycle

__all__ = ["control", "launch_many"]


def launch_many(pairs: list[tuple[int, int]], *, node: str = "") -> str:
    """Launch these (task id, attempt number) placed on ``node`` ('': run inline, any node)."""
    results = lifecycle.launch_many(
        [(task_id, attempt_no) for task_id, attempt_no in pairs], node=node, may_fork=not node
    )
    return f"{results.count('launched')} of {len(results)} launched"


def control(task_id: int, attempt_no: int, action: str, *, node: str = "") -> str:
    return lifecycle.control(task_id, attempt_no, action)
