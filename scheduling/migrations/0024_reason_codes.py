"""Reasons as data: a code and parameters beside the English text, on tasks and their events
(scheduling.reasons). Old rows keep no code and render as their text.

The columns get database defaults too: the bulk statements that write tasks and events
(transitions.moved, the submission's INSERT) name their columns, and a path that names neither
must still write an empty code."""

from django.db import migrations, models

DEFAULTS = """
ALTER TABLE scheduling_task ALTER COLUMN reason_code SET DEFAULT '',
                            ALTER COLUMN reason_params SET DEFAULT '{}'::jsonb;
ALTER TABLE scheduling_taskevent ALTER COLUMN reason_code SET DEFAULT '',
                                 ALTER COLUMN reason_params SET DEFAULT '{}'::jsonb;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0023_scheduler_forecast"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="reason_code",
            field=models.CharField(
                blank=True,
                help_text="The reason as data: its code in scheduling.reasons' catalogue (empty: the text only, as rows written before codes existed).",
                max_length=40,
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="reason_params",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The reason's parameters (scheduling.reasons).",
            ),
        ),
        migrations.AlterField(
            model_name="task",
            name="reason",
            field=models.TextField(
                blank=True, help_text="Why it waits, or how it ended (English)."
            ),
        ),
        migrations.AddField(
            model_name="taskevent",
            name="reason_code",
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AddField(
            model_name="taskevent",
            name="reason_params",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunSQL(DEFAULTS, migrations.RunSQL.noop),
    ]
