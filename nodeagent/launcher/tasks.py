"""django-q2 task functions run by the node's own cluster: each only dispatches and returns."""

from __future__ import annotations

from nodeagent.launcher import lifecycle


def launch_many(pairs: list[tuple[int, int]]) -> str:
    results = lifecycle.launch_many([(task_id, attempt_no) for task_id, attempt_no in pairs])
    return f"{results.count('launched')} of {len(results)} launched"


def control(task_id: int, attempt_no: int, action: str) -> str:
    return lifecycle.control(task_id, attempt_no, action)
