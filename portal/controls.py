"""Which of cancel, pause, resume and retry a task's state offers (the services refuse the
rest anyway): the task page shows these buttons, and hides the others as the state changes."""

from __future__ import annotations

from scheduling.states import TERMINAL, TaskState

BY_STATE = {
    TaskState.PENDING: ("cancel",),
    TaskState.SCHEDULED: ("cancel",),
    TaskState.RUNNING: ("cancel", "pause"),
    TaskState.PAUSED: ("cancel", "resume"),
    TaskState.PREEMPTED: ("cancel",),
}


def controls_for(task) -> list[str]:
    controls = list(BY_STATE.get(TaskState(task.state), ()))
    if task.state in TERMINAL and task.state != TaskState.SUCCEEDED:
        controls.append("retry")
    elif task.state == TaskState.PENDING and task.hold_reason:
        controls.append("retry")
    return controls
