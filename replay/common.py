"""What the replay's modules share: the policies, the trace's columns and classes, the rules."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.policy.model import (
    BATCH,
    ONLINE,
    Decision,
    Snapshot,
)

PolicyFn = Callable[[Snapshot], Decision]

POLICIES = ("ours", "fifo")

TRACE_COLUMNS = ("job_id", "tenant", "qos", "submit_time_s", "duration_s", "num_gpus", "gpu_milli")

# qos -> (task class, priority, preemptible). Batch work is preemptible by default on the
# platform; latency-sensitive online work never is.
QOS_CLASSES: dict[str, tuple[str, int, bool]] = {
    "LS": (ONLINE, 90, False),
    "BE": (BATCH, 10, True),
    "Burstable": (BATCH, 50, True),
    "Guaranteed": (BATCH, 50, True),
}

POOL = "default"
GPU_TYPE = "sim"

# A policy that preempts may place the preemptor only on the next pass; the simulator reruns the
# policy at the same instant after preemptions. A policy that preempts on every pass would spin.
MAX_PASSES_PER_INSTANT = 50


class PolicyViolation(AssertionError):
    """The policy returned a decision that breaks a placement rule, or never placed a job."""
