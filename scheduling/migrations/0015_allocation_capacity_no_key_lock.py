"""The capacity trigger (migration 0003) locks the GPU row FOR NO KEY UPDATE, not FOR UPDATE.

Two transactions allocating the same GPU still wait for each other (NO KEY UPDATE conflicts
with itself and with any UPDATE of the row), but a foreign-key check on the GPU (KEY SHARE)
no longer waits for a pass that placed on it to commit: every sampling tick's INSERT of GPU
samples checks its node's GPUs at commit, and waited for the pass (pg_stat_statements in the
throughput bench: that check averaged 0.17 ms over 4,000 calls, most of it waiting).
"""

import importlib

from django.db import migrations

_0003 = importlib.import_module("scheduling.migrations.0003_allocation_capacity_trigger")
_FUNCTION = _0003.CREATE.split("CREATE TRIGGER")[0].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)
assert "FOR UPDATE;" in _FUNCTION  # noqa: S101 - the one line this migration changes

NO_KEY = _FUNCTION.replace("FOR UPDATE;", "FOR NO KEY UPDATE;")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0014_task_list_indexes")]

    operations = [migrations.RunSQL(NO_KEY, reverse_sql=_FUNCTION)]
