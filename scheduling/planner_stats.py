"""The planner's statistics of the tables every task passes through, kept up with bursts.

PostgreSQL's autovacuum analyses a table once a tenth of it has changed, and visits each database
once a minute (``autovacuum_naptime``). A burst of submissions into a young installation (a few
hundred rows, then many times as many in a second) left the planner for up to that minute with
statistics that said the task table held no pending task, and it drove the node agents' key
lookups from a scan of the whole table (auto_explain, in the throughput bench's first line: each
hand-off read every task to place two) until autovacuum came by. After a pass, the scheduler
analyses each of these tables that changed by more than half since it was last analysed (and by
``MIN_CHANGED`` rows at least): on a table that has been in use for a while that is what
autovacuum already did, long before.

Either way an ANALYZE of a task table costs what its columns cost: ``UNFILTERED`` lists the wide
ones no query filters, joins or sorts on, whose statistics (the migration that sets their target
to 0) the planner would never read; sorting samples of them was most of each ANALYZE.
"""

from __future__ import annotations

import logging
import time

from django.db import connection
from psycopg import sql

logger = logging.getLogger(__name__)

TABLES = ("scheduling_task", "scheduling_taskattempt", "scheduling_allocation")
# Columns without planner statistics (migration 0034): add a column here, in a migration that
# sets its target to 0, only if no query's WHERE, JOIN or ORDER BY reads it.
UNFILTERED = {
    "scheduling_task": ("command", "workdir", "env", "spec", "reason", "reason_params", "wait",
                        "hold_reason"),
    "scheduling_taskattempt": ("gpu_uuids", "log_path", "end_reason", "health_detail"),
}  # fmt: skip
MIN_CHANGED = 500  # rows changed since the last ANALYZE, at the least
SHARE = 0.5  # of the rows the table holds
EVERY_S = 5.0  # the most often this process looks

_looked = -EVERY_S  # monotonic time of the last look, in this process


def keep_up() -> list[str]:
    """Analyse the tables of ``TABLES`` whose statistics a burst left behind; returns their
    names. Looks at most once every ``EVERY_S`` (one catalogue read)."""
    global _looked
    now = time.monotonic()
    if now - _looked < EVERY_S:
        return []
    _looked = now
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT relname FROM pg_stat_user_tables
             WHERE schemaname = current_schema() AND relname = ANY(%s)
               AND n_mod_since_analyze >= GREATEST(%s, %s * n_live_tup)
             ORDER BY relname
            """,
            [list(TABLES), MIN_CHANGED, SHARE],
        )
        stale = [name for (name,) in cursor.fetchall()]
        for name in stale:
            began = time.perf_counter()
            statement = sql.SQL("ANALYZE {}").format(sql.Identifier(name))
            cursor.execute(statement.as_string(connection.connection))
            logger.info("analysed %s (%.0f ms)", name, (time.perf_counter() - began) * 1000)
    return stale
