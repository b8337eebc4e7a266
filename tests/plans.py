"""What PostgreSQL's executed plan of a statement read: for tests that a statement's cost follows
the active set (pending and running tasks, open allocations) and not the finished history."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection


def rows_visited(sql: str, params, tables: Iterable[str], *, generic: bool = False) -> int:
    """Rows the statement's executed plan read from ``tables``: those their scans returned,
    once per loop, and those they filtered out. ``generic``: the plan PostgreSQL may switch a
    prepared statement to after its fifth run, which cannot see the parameters' values
    (``params`` then a dict, in the order of their ``%(name)s`` in ``sql``)."""
    with connection.cursor() as cursor:
        if not generic:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
            (plan,) = cursor.fetchone()[0]
            return _visited(plan["Plan"], set(tables))
        names = list(params)
        for number, name in enumerate(names, 1):
            sql = sql.replace(f"%({name})s", f"${number}")
        cursor.execute(f"PREPARE plan_probe AS {sql}")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            arguments = ", ".join(["%s"] * len(names))
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE plan_probe({arguments})",
                [params[name] for name in names],
            )
            (plan,) = cursor.fetchone()[0]
        finally:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("DEALLOCATE plan_probe")
    return _visited(plan["Plan"], set(tables))


def _visited(node: dict, tables: set[str]) -> int:
    visited = 0
    if node.get("Relation Name") in tables:
        visited += node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
        visited += node.get("Rows Removed by Filter", 0)
        visited += node.get("Rows Removed by Index Recheck", 0)
    return visited + sum(_visited(child, tables) for child in node.get("Plans", ()))
