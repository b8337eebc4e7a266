"""Why a pending task waits, and why a pass preempts one, as reasons of ``scheduling.reasons``'
catalogue: what a scheduling pass stores beside its English text, so that pages, the API and
gpuctl say it in the reader's language.

The policy core decides a ``Wait``: a code, its English text and the figures behind it
(``details``). ``of_wait`` turns those figures into a reason whose English is that very text;
a wait it cannot say so (a text-only policy's, a dependency's or a person's hold, figures it does
not know) stays a ``text`` reason, shown as written, as before.
"""

from __future__ import annotations

import re
from typing import Any

from scheduling import reasons
from scheduling.policy import Preemption, Wait
from scheduling.policy.books import format_gib, format_num, format_utc
from scheduling.reasons import Reason


def of_wait(wait: Wait) -> Reason:
    """The reason of ``wait`` (without its place in line, as the pass stores it)."""
    try:
        reason = _reason(wait.code, wait.details, wait.text)
    except (KeyError, TypeError, ValueError):
        reason = None
    # The English stays exactly what the policy wrote (the API's, the logs'), or no code.
    if reason is None or reason.text != wait.text:
        return reasons.of(wait.text)
    return reason


def of_preemption(preemption: Preemption) -> Reason:
    """The reason a victim is preempted with, as ``of_wait`` says a wait."""
    details = preemption.details
    try:
        params = {
            "task": preemption.for_task_id,
            "task_class": _data(Reason(f"class_{details['task_class']}")),
            "priority": details["priority"],
        }
        if details["reclaimed"]:
            params["reclaimed"] = _data(Reason(f"class_{details['reclaimed']}"))
            reason = Reason("preempted_to_reclaim", params)
        else:
            reason = Reason("preempted_for", params)
    except (KeyError, TypeError, ValueError):
        return reasons.of(preemption.reason)
    return reason if reason.text == preemption.reason else reasons.of(preemption.reason)


def _reason(code: str, details: dict[str, Any], text: str = "") -> Reason | None:
    if code == "queue":
        which = "wait_queue_runs" if details["running"] else "wait_queue_behind"
        reason = Reason(which, {"queue": details["queue"], "behind": details["behind"]})
    elif code == "backoff":
        reason = Reason("wait_backoff", {"at": format_utc(details["not_before"])})
    elif code == "capacity":
        reason = _capacity(details)
    elif code == "reserved":
        at = details["expected_at"]
        eta = Reason("eta_unknown") if at is None else Reason("eta_at", {"at": format_utc(at)})
        needs = _capacity({**details, "node": details["required_node"]})
        params = {"needs": _data(needs), "node": details["node"], "eta": _data(eta)}
        reason = Reason("wait_reserved", params)
    elif code == "quota":
        reason = _quota(details)
    elif code == "preempting":
        params = {"count": len(details["victims"]), "node": details["node"]}
        reason = Reason("wait_preempting", params)
    elif code == "dependencies":
        reason = _dependencies(text)
    else:  # held, other: words decided outside the core, as written
        return None
    if "reclaim_at" in details:  # a class that lent GPUs, not yet allowed to take them back
        task_class = Reason(f"class_{details['task_class']}")
        note = Reason(
            "reclaim",
            {
                "task_class": _data(task_class),
                "holds": format_num(details["class_holds"]),
                "guarantee": details["class_guarantee"],
                "at": format_utc(details["reclaim_at"]),
            },
        )
        reason = reason.noted(note)
    return reason


# What the snapshot writes of a task's dependencies not yet succeeded (``snapshot``'s
# ``_dependency_blocks``): "waiting for prep (#3, running), data (#4, pending)". Names hold no
# spaces, so each item reads back whole; ``of_wait`` checks the English it makes again.
_DEPENDENCY = re.compile(r"(\S+) \(#(\d+), (\w+)\)")


def _dependencies(text: str) -> Reason | None:
    if not text.startswith("waiting for "):
        return None
    tasks = [
        _data(
            Reason(
                "dependency",
                {"name": name, "id": int(pk), "state": _data(Reason(f"state_{state}"))},
            )
        )
        for name, pk, state in _DEPENDENCY.findall(text)
    ]
    return Reason("waiting_for_dependencies", {"tasks": tasks}) if tasks else None


def _capacity(details: dict[str, Any]) -> Reason:
    gpus, kind = details["gpus"], details["gpu_type"] or "GPU"
    if not details["exclusive"]:
        memory = format_gib(details["gpu_memory_mb"] or 0)
        what = Reason("what_shared", {"gpus": gpus, "kind": kind, "memory": memory})
    elif details["gpus_max"] > gpus:
        what = Reason(
            "what_gpu_range", {"gpus": gpus, "gpus_max": details["gpus_max"], "kind": kind}
        )
    else:
        what = Reason("what_gpus", {"gpus": gpus, "kind": kind})
    node, pool = details["node"], details["pool"]
    if node:
        where = Reason("where_node_pool", {"node": node, "pool": pool}) if pool else (
            Reason("where_node", {"node": node}))  # fmt: skip
    elif gpus > 1:
        where = Reason("where_one_node_pool", {"pool": pool}) if pool else Reason("where_one_node")
    else:
        where = Reason("where_pool", {"pool": pool}) if pool else reasons.of("")
    fitting = Reason(
        "fitting_idle" if details["exclusive"] else "fitting_memory",
        {"count": details["fitting_now"]},
    )
    return Reason(
        "wait_capacity", {"what": _data(what), "where": _data(where), "fitting": _data(fitting)}
    )


def _quota(details: dict[str, Any]) -> Reason:
    tenant, pool = details["tenant"], details["pool"]
    scope = Reason("scope_tenant_pool", {"tenant": tenant, "pool": pool}) if pool else (
        Reason("scope_tenant", {"tenant": tenant}))  # fmt: skip
    limit, of = details["limit"], details["of"]
    if limit == "gpus":
        code, limit_text = "wait_quota_gpus", of
    elif limit == "gpu_memory_mb":
        code, limit_text = "wait_quota_memory", format_gib(of)
    else:
        code, limit_text = "wait_quota_tasks", of
    return Reason(code, {"scope": _data(scope), "limit": limit_text})


def _data(reason: Reason) -> dict[str, Any]:
    """A reason as another's parameter."""
    return reason.as_data()
