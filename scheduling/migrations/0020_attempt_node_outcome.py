from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The attempts' (node, outcome) index (TaskAttempt.Meta), built without holding up the
    launches and reports of a running platform on an installation with a long history."""

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("scheduling", "0019_usage_counted_at_commit"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskattempt",
            index=models.Index(fields=["node", "outcome"], name="attempt_node_outcome"),
        ),
    ]
