"""Invariant 1 in the database: a GPU's active allocations never exceed its memory, and an
exclusive allocation never shares its GPU.

A CHECK constraint cannot see other rows, so a trigger does it. It locks the GPU row first, so
two transactions allocating the same GPU at once are serialised and the second one sees the
first's allocation: the guarantee holds even for a scheduler with a bug, or two of them.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION scheduling_allocation_check_capacity() RETURNS trigger AS $$
DECLARE
    capacity integer;
    reserved bigint;
    sharing integer;
    sharing_exclusive integer;
BEGIN
    IF NEW.released_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    SELECT memory_mb INTO capacity FROM scheduling_gpu WHERE id = NEW.gpu_id FOR UPDATE;
    SELECT COALESCE(SUM(memory_mb), 0), COUNT(*), COUNT(*) FILTER (WHERE exclusive)
      INTO reserved, sharing, sharing_exclusive
      FROM scheduling_allocation
     WHERE gpu_id = NEW.gpu_id AND released_at IS NULL AND id <> NEW.id;
    IF sharing > 0 AND (NEW.exclusive OR sharing_exclusive > 0) THEN
        RAISE EXCEPTION 'GPU % is held by % other allocation(s); exclusive use cannot share it',
            NEW.gpu_id, sharing USING ERRCODE = 'check_violation';
    END IF;
    IF reserved + NEW.memory_mb > capacity THEN
        RAISE EXCEPTION 'GPU % would have % MiB reserved, more than its % MiB',
            NEW.gpu_id, reserved + NEW.memory_mb, capacity USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER scheduling_allocation_capacity
    BEFORE INSERT OR UPDATE OF gpu_id, memory_mb, exclusive, released_at
    ON scheduling_allocation
    FOR EACH ROW EXECUTE FUNCTION scheduling_allocation_check_capacity();
"""

DROP = """
DROP TRIGGER IF EXISTS scheduling_allocation_capacity ON scheduling_allocation;
DROP FUNCTION IF EXISTS scheduling_allocation_check_capacity();
"""


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0002_initial")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]
