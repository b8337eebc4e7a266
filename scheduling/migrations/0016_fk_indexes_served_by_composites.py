"""Three foreign keys lose their own index: each leads a composite index that serves every
lookup by it (task.tenant: task_tenant_state and three more; taskattempt.task:
attempt_unique_number; taskevent.task: taskevent_task_at), and every INSERT, and every task
update that changes an indexed column, wrote an entry in each.

Only the indexes are dropped: Django's own AlterField would also drop and re-add the foreign
keys, which re-checks every row of the table under a lock (a million tasks on a busy cluster)."""

import django.db.models.deletion
from django.db import migrations, models

# (index Django named, table, column)
INDEXES = [
    ("scheduling_task_tenant_id_a495b40f", "scheduling_task", "tenant_id"),
    ("scheduling_taskattempt_task_id_709ec383", "scheduling_taskattempt", "task_id"),
    ("scheduling_taskevent_task_id_a52c523b", "scheduling_taskevent", "task_id"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0015_allocation_capacity_no_key_lock"),
        ("tenants", "0004_rate_limit_pace"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")',
                )
                for name, table, column in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="task",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="tasks",
                        to="tenants.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="taskattempt",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="scheduling.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="taskevent",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="scheduling.task",
                    ),
                ),
            ],
        )
    ]
