"""The fair-share counters' triggers (migration 0010) run when the transaction commits, not when
the allocation is released.

The trigger updates its tenant's one counter row, whose lock it then held until the commit. A
node agent records plain ends and hands their GPUs on in one transaction of three round trips
(``launcher.handoff``): every other agent's ends of the same tenant's tasks waited behind it
(PostgreSQL's statement log, throughput bench: the statement that records plain ends averaged
15 ms over 1,812 calls, 28 of the run's 53 seconds of statements, most of it waiting). Deferred
to the commit, the row is held for the commit alone. The count is the same: the trigger sees
the row as released, in the same transaction.
"""

from django.db import migrations

_IMMEDIATE = """
CREATE TRIGGER scheduling_allocation_released
    AFTER UPDATE OF released_at ON scheduling_allocation
    FOR EACH ROW WHEN (OLD.released_at IS NULL AND NEW.released_at IS NOT NULL)
    EXECUTE FUNCTION scheduling_allocation_release_usage();

CREATE TRIGGER scheduling_allocation_inserted_released
    AFTER INSERT ON scheduling_allocation
    FOR EACH ROW WHEN (NEW.released_at IS NOT NULL)
    EXECUTE FUNCTION scheduling_allocation_release_usage();
"""

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

    operations = [migrations.RunSQL(_DROP + _DEFERRED, reverse_sql=_DROP + _IMMEDIATE)]
