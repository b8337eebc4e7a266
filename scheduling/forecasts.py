"""When waiting tasks are expected to start: the history a pass's forecast rests on, the
forecast stored on the scheduler's row, and the estimate as people read it.

A pass estimates the first ``FORECAST_LIMIT`` tasks in line (``policy.forecast``) and stores
the estimates in ``SchedulerState.forecast`` in the statement that records the pass; reads
join them to tasks with their places in line (``Task.attach_places``). Typical runtimes come
from the recent succeeded tasks (``HISTORY_ROWS`` at most), read at most once every
``HISTORY_TTL_S`` per process, so a pass pays for history only now and then.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext as _

from scheduling.policy.forecast import (
    BASIS_COMMAND,
    BASIS_PLATFORM,
    BASIS_TENANT,
    FORECAST_LIMIT,
    Runtime,
)
from scheduling.states import TaskState

HISTORY_TTL_S = 300.0
HISTORY_ROWS = 20000
QUANTILES = (0.1, 0.5, 0.9)  # a short, a typical and a long runtime

# The runtimes of the most recent succeeded tasks, per tenant and command, per tenant and for
# the platform (GROUPING SETS), as quantiles. Commands are compared by digest.
_HISTORY = f"""
    SELECT tenant_id, digest, GROUPING(tenant_id, digest),
           percentile_cont(%(q)s::float8[]) WITHIN GROUP (ORDER BY seconds)
      FROM (SELECT tenant_id, md5(command) AS digest,
                   EXTRACT(EPOCH FROM finished_at - started_at)::float8 AS seconds
              FROM scheduling_task
             WHERE state = '{TaskState.SUCCEEDED.value}'
               AND started_at IS NOT NULL AND finished_at IS NOT NULL
             ORDER BY id DESC
             LIMIT %(rows)s) recent
     GROUP BY GROUPING SETS ((tenant_id, digest), (tenant_id), ())
"""  # noqa: S608 - the state is the code's constant

_KEYS = "SELECT id, tenant_id, md5(command) FROM scheduling_task WHERE id = ANY(%s::bigint[])"

_cache_lock = threading.Lock()
_cache: dict = {"at": None, "history": None}


def history(*, fresh: bool = False) -> dict:
    """Typical runtimes by (tenant id, command digest), by tenant id and for the platform
    (key None), read at most once every ``HISTORY_TTL_S`` (``fresh``: now)."""
    with _cache_lock:
        at = _cache["at"]
        if fresh or at is None or time.monotonic() - at > HISTORY_TTL_S:
            with connection.cursor() as cursor:
                cursor.execute(_HISTORY, {"q": list(QUANTILES), "rows": HISTORY_ROWS})
                table: dict = {}
                for tenant_id, digest, grouping, values in cursor:
                    if values is None or values[1] is None:
                        continue
                    low, mid, high = values
                    if grouping == 0:
                        table[(tenant_id, digest)] = Runtime(low, mid, high, BASIS_COMMAND)
                    elif grouping == 1:
                        table[tenant_id] = Runtime(low, mid, high, BASIS_TENANT)
                    else:
                        table[None] = Runtime(low, mid, high, BASIS_PLATFORM)
            _cache["history"], _cache["at"] = table, time.monotonic()
        return _cache["history"]


def forget_history() -> None:
    """The next ``history()`` reads the table again (tests, after writing history)."""
    with _cache_lock:
        _cache["at"] = None


def runtimes_for(task_ids: list[int]) -> dict[int, Runtime]:
    """What history says of each of these tasks' runtime: its tenant's succeeded tasks with
    the same command, else its tenant's, else the platform's; absent when there is none."""
    table = history()
    if not table or not task_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_KEYS, [task_ids])
        keys = cursor.fetchall()
    found = {}
    for task_id, tenant_id, digest in keys:
        runtime = table.get((tenant_id, digest)) or table.get(tenant_id) or table.get(None)
        if runtime is not None:
            found[task_id] = runtime
    return found


def _moment(seconds: float | None, now: datetime) -> str:
    if seconds is None:
        return ""
    moment = timezone.localtime(datetime.fromtimestamp(seconds, UTC))
    if moment.date() == timezone.localtime(now).date():
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


def expected_start(
    estimate: list | None, place: tuple[int, int] | None, now: datetime | None = None
) -> dict:
    """A waiting task's expected start as the API and the pages show it: ``at``,
    ``earliest``, ``latest`` (datetimes or None), ``basis`` and a sentence (``text``).

    ``estimate``: the last pass's (``Task.start_estimate``); ``place``: its place in line."""
    now = now or timezone.now()
    if estimate is None:
        if place is not None and place[0] > FORECAST_LIMIT:
            text = _("later: after the first %(n)d in line") % {"n": FORECAST_LIMIT}
            basis = "later"
        else:
            text = _("unknown: it is not in line for GPUs")
            basis = "unknown"
        return {"at": None, "earliest": None, "latest": None, "basis": basis, "text": text}
    at, earliest, latest, basis = estimate
    moments = {
        key: None if value is None else datetime.fromtimestamp(value, UTC)
        for key, value in (("at", at), ("earliest", earliest), ("latest", latest))
    }
    if at is None:
        text = _("unknown: nothing to go by (the tasks ahead have no timeout and no history)")
    elif at <= now.timestamp() + 60 and basis == "now":
        text = _("now: GPUs that fit it are free")
    elif latest is None:
        text = _("about %(at)s, at the earliest %(earliest)s, perhaps much later") % {
            "at": _moment(at, now),
            "earliest": _moment(earliest, now),
        }
    else:
        text = _("about %(at)s, between %(earliest)s and %(latest)s") % {
            "at": _moment(at, now),
            "earliest": _moment(earliest, now),
            "latest": _moment(latest, now),
        }
    sources = {
        "command": _("from the runtimes of your earlier tasks with the same command"),
        "tenant": _("from the runtimes of your earlier tasks"),
        "platform": _("from the runtimes of earlier tasks on the platform"),
        "timeout": _("from the timeouts of the tasks ahead"),
    }
    if at is not None and basis in sources:
        text = f"{text} ({sources[basis]})"
    return {**moments, "basis": basis, "text": text}
