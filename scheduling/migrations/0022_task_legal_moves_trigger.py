"""A task's state changes only by a legal move, whoever writes it, raw SQL included.

``LEGAL`` is ``scheduling.states.TRANSITIONS`` as of this migration, written out: a migration
must not change when the code does, so a change of the table needs a new migration
(``tests/scheduling/test_one_state_machine.py`` fails while the two differ).

The check is the trigger's ``WHEN`` condition, which PostgreSQL evaluates itself for each row
whose state the UPDATE changes: the function, which only raises, is called for an illegal move
and never for a legal one. A state that is no state at all is left to the CHECK constraint
``task_state_valid``. The refusal is a check violation (an IntegrityError in Django) naming
the move and the task.
"""

from django.db import migrations

LEGAL = (
    ("pending", "scheduled"),
    ("pending", "failed"),
    ("pending", "cancelled"),
    ("scheduled", "pending"),
    ("scheduled", "running"),
    ("scheduled", "preempted"),
    ("scheduled", "lost"),
    ("scheduled", "failed"),
    ("scheduled", "cancelled"),
    ("scheduled", "timed_out"),
    ("running", "pending"),
    ("running", "paused"),
    ("running", "preempted"),
    ("running", "lost"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "timed_out"),
    ("paused", "running"),
    ("paused", "preempted"),
    ("paused", "lost"),
    ("paused", "failed"),
    ("paused", "cancelled"),
    ("paused", "timed_out"),
    ("preempted", "pending"),
    ("preempted", "cancelled"),
    ("lost", "pending"),
    ("lost", "failed"),
    ("lost", "cancelled"),
    ("failed", "pending"),
    ("cancelled", "pending"),
    ("timed_out", "pending"),
)
STATES = sorted({state for move in LEGAL for state in move})


def _array(values) -> str:
    return "'{" + ",".join(values) + "}'::text[]"


CREATE = f"""
CREATE FUNCTION scheduling_task_refuse_move() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'a task cannot go from % to % (task %)', OLD.state, NEW.state, OLD.id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'task_legal_move',
              TABLE = 'scheduling_task';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER scheduling_task_legal_move
    BEFORE UPDATE OF state ON scheduling_task
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND NEW.state = ANY ({_array(STATES)})
          AND (OLD.state || '>' || NEW.state) <> ALL ({_array(f"{a}>{b}" for a, b in LEGAL)}))
    EXECUTE FUNCTION scheduling_task_refuse_move();
"""  # noqa: S608 - constant text

DROP = """
DROP TRIGGER IF EXISTS scheduling_task_legal_move ON scheduling_task;
DROP FUNCTION IF EXISTS scheduling_task_refuse_move();
"""


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0021_pass_idle_gpus")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]
