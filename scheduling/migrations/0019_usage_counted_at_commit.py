"""The fair-share counters' triggers (migration 0010) run when the transaction commits, not when
the allocation is released.

The trigger updates its tenant's one counter row, whose lock it then held until the commit. A
node agent records plain ends and hands their GPUs on in one transaction of three round trips
(``launcher.handoff``): every other agent's ends of the same tenant's tasks waited behind it
(PostgreSQL's statement log, throughput bench: the statement that records plain ends averaged
15 ms over 1,812 calls, 28 of the run's 53 seconds of statements, most of it waiting). Deferred
to the commit, the row is held for the commit alone. The count is the same: the trigger sees
the row as released, in the same transaction. At the commit, though, the allocation or its task
may be gone (deleted in that transaction, as a test's teardown or a purge does): such an
allocation is no longer history, and a scan of the history would not count it either, so the
trigger now counts nothing for it (before, it failed on the missing tenant).
"""

import importlib

from django.db import migrations

_0010 = importlib.import_module("scheduling.migrations.0010_fair_share_counters")
_FUNCTION = _0010.RELEASE.split("CREATE TRIGGER")[0].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)
_LOOKUP = "SELECT tenant_id INTO tenant FROM scheduling_task WHERE id = NEW.task_id;"
assert _LOOKUP in _FUNCTION  # noqa: S101 - the line this migration guards
_GUARDED = _FUNCTION.replace(
    _LOOKUP,
    _LOOKUP  # noqa: S608 - constant text
    + """
    IF tenant IS NULL
       OR NOT EXISTS (SELECT 1 FROM scheduling_allocation WHERE id = NEW.id) THEN
        RETURN NULL;  -- deleted before the commit: not history any more
    END IF;""",
)

_IMMEDIATE = _0010.RELEASE[_0010.RELEASE.index("CREATE TRIGGER") :]  # as 0010 made them

_DEFERRED = """
CREATE CONSTRAINT TRIGGER scheduling_allocation_released
    AFTER UPDATE OF released_at ON scheduling_allocation
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.released_at IS NULL AND NEW.released_at IS NOT NULL)
    EXECUTE FUNCTION scheduling_allocation_release_usage();

CREATE CONSTRAINT TRIGGER scheduling_allocation_inserted_released
    AFTER INSERT ON scheduling_allocation
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.released_at IS NOT NULL)
    EXECUTE FUNCTION scheduling_allocation_release_usage();
"""

_DROP = """
DROP TRIGGER scheduling_allocation_released ON scheduling_allocation;
DROP TRIGGER scheduling_allocation_inserted_released ON scheduling_allocation;
"""


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0018_successors")]

    operations = [
        migrations.RunSQL(_GUARDED, reverse_sql=_FUNCTION),
        migrations.RunSQL(_DROP + _DEFERRED, reverse_sql=_DROP + _IMMEDIATE),
    ]
