"""The flag that coalesces requests for a pass moves to a row of its own (``PassRequest``), so
the node agents' end reports can claim it in the statement that frees GPUs: on the scheduler's
row, which a pass writes while it holds its placed tasks' locks, the two would wait for each
other. The flag is carried over either way."""

from django.db import migrations, models

COPY = """INSERT INTO scheduling_passrequest (id, queued)
          SELECT 1, pass_queued FROM scheduling_schedulerstate WHERE id = 1"""
COPY_BACK = """UPDATE scheduling_schedulerstate s SET pass_queued = r.queued
                 FROM scheduling_passrequest r WHERE s.id = 1 AND r.id = 1"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0016_fk_indexes_served_by_composites"),
    ]

    operations = [
        migrations.CreateModel(
            name="PassRequest",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "queued",
                    models.BooleanField(
                        default=False,
                        help_text="A pass is queued and not yet started: no need to queue another.",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="passrequest_singleton"
                    )
                ],
            },
        ),
        migrations.RunSQL(COPY, COPY_BACK),
        migrations.RemoveField(
            model_name="schedulerstate",
            name="pass_queued",
        ),
    ]
