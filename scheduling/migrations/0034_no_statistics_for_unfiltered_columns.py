"""No planner statistics for the wide columns of tasks and attempts that no query filters,
joins or sorts on (scheduling.planner_stats.UNFILTERED).

ANALYZE sorts a sample of every column to find its common values and histogram; for a task's
spec, environment, wait and reason (jsonb and text, hundreds of bytes each) that was five sixths
of an ANALYZE of scheduling_task (124 ms against 20 ms for 4,200 tasks), and the planner never
read what it found. The scheduler analyses these tables after bursts, autovacuum as they change."""

from django.db import migrations

from scheduling.planner_stats import UNFILTERED


def statements(target: int) -> list[str]:
    return [
        f"ALTER TABLE {table} "
        + ", ".join(f"ALTER COLUMN {column} SET STATISTICS {target}" for column in columns)
        for table, columns in UNFILTERED.items()
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0033_successor_one_for_one"),
    ]

    operations = [migrations.RunSQL(statements(0), reverse_sql=statements(-1))]
