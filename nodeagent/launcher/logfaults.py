"""A log disk that fails (full, read-only, removed): what tasks are told, what operators see.

A fault of the log disk is the node's, not a task's: the task runs on and its reason says what
output was lost (``logrelay.LogRelay``), and the node gets one ``task_log_io`` alert, raised
by its agent (``relay``) when a supervisor says so (``messages.LogTrouble``), not one per task.
Nothing here loads Django's models until an alert is raised.
"""

from __future__ import annotations

import errno

# The node agent refreshes its node's open alert at most this often, however many tasks say
# their log cannot be written: the alert is the node's, one per node.
ALERT_EVERY_S = 60.0

_WHY = {
    errno.ENOSPC: "the log disk is full",
    errno.EDQUOT: "the log disk is full (quota)",
    errno.EROFS: "the log disk is read-only",
    errno.EACCES: "the log directory refuses writes",
    errno.EPERM: "the log directory refuses writes",
    errno.ENOENT: "the log directory is gone",
    errno.ENOTDIR: "the log directory is gone",
}
REMOVED = "the log was removed while the task ran"


def why(error: OSError | None) -> str:
    """What went wrong with the log disk, in the words of a task's reason."""
    if error is None:
        return REMOVED
    return _WHY.get(error.errno, f"the log cannot be written ({error.strerror})")


def lost(error: OSError | None, dropped: int) -> str:
    """The note a task's reason ends with when output was lost (``dropped`` bytes)."""
    if dropped:
        return f"output not kept: {why(error)} ({dropped} bytes dropped)"
    if error is None:
        return f"output not kept: {REMOVED}"
    return f"output may be incomplete: {why(error)}"  # the log could not be closed


def alert_message(node: str, path: str, error: str) -> str:
    return (
        f"node {node}: task logs cannot be written ({path}: {error}); tasks run on, their "
        "output is dropped and their reasons say so"
    )


def raise_alert(node: str, message: str) -> None:
    """The node's ``task_log_io`` alert, opened or refreshed (one per node)."""
    from monitoring import services as alerts
    from monitoring.models import AlertKind, Severity
    from scheduling.models import Node

    alerts.alert_raise(
        kind=AlertKind.TASK_LOG_IO,
        severity=Severity.WARNING,
        message=message,
        node=Node.objects.get(name=node),
    )
