from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0022_task_legal_moves_trigger"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedulerstate",
            name="forecast",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="When the first tasks in line are expected to start, as the last pass estimated it (scheduling.forecasts): task id -> [expected, earliest, latest, basis], epoch seconds or null.",
            ),
        ),
    ]
