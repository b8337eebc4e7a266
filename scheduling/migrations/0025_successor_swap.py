from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0024_reason_codes"),
    ]

    operations = [
        migrations.AddField(
            model_name="successor",
            name="swap_tenant",
            field=models.BigIntegerField(
                blank=True,
                null=True,
                help_text="Set (its tenant's id) when its tenant has no room in its quota: it "
                "takes only GPUs its tenant's ended tasks free, one ended task for one started.",
            ),
        ),
        migrations.AddField(
            model_name="successor",
            name="memory_mb",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="What it reserves on each GPU it takes, sharing the card; 0: held whole.",
            ),
        ),
        migrations.AlterField(
            model_name="successor",
            name="gpus",
            field=models.PositiveSmallIntegerField(help_text="GPUs it takes, on one node."),
        ),
        migrations.AddIndex(
            model_name="successor",
            index=models.Index(
                fields=["generation", "swap_tenant", "rank"], name="successor_swaps"
            ),
        ),
    ]
