"""Which of its limits an attempt hit, from its cgroup's counters, for the task's reason.

Read at the attempt's end, before its cgroup is removed. A memory limit hit kills (the kernel's
OOM killer, exit 137) and fails the task; a process limit refuses forks, which a task may or may
not survive: it fails the task with the limit named when the command failed, and is noted on a
success; a CPU quota only slows the task down, and is noted when it held the task back in more
than ``THROTTLED_SHARE`` of its periods.
"""

from __future__ import annotations

OOM = "killed by the kernel: out of memory (over resources.memory)"
# A task throttled in more than this share of its CPU periods was held back by resources.cpus
# for most of its run, worth saying; a few throttled periods are a burst, not news.
THROTTLED_SHARE = 0.5


def limits_hit(tracker, resources: dict, exit_code: int | None, *, plain: bool) -> tuple[str, str]:
    """(problem, note) for the attempt's end: ``problem`` fails the task, ``note`` ends its
    reason whatever the outcome. ``plain``: the command ended by itself (not stopped, not timed
    out), so a process limit hit may explain its failure."""
    if exit_code is None:
        return "", ""
    if exit_code == 137 and tracker.oom_kills():
        return OOM, ""  # the kernel killed it: whatever else happened, that explains exit 137
    notes = []
    problem = ""
    refused = tracker.pids_refused()
    if refused:
        hit = (
            f"hit the process limit (resources.pids: {resources.get('pids')}; "
            f"{refused} forks refused)"
        )
        if plain and exit_code != 0:
            problem = f"exited with {exit_code} after it {hit}"
        else:
            notes.append(hit)
    periods, throttled = tracker.cpu_throttling()
    if periods and throttled > periods * THROTTLED_SHARE:
        notes.append(
            f"held back by the CPU limit (resources.cpus: {resources.get('cpus')}; throttled "
            f"in {throttled} of {periods} periods)"
        )
    return problem, "; ".join(notes)
