from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0023_scheduler_forecast"),
    ]

    operations = [
        migrations.AddField(
            model_name="successor",
            name="swap",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Its tenant has no room in its quota: it takes only GPUs its tenant's "
                "ended tasks free, one ended task for one started.",
            ),
        ),
    ]
