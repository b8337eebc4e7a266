from django.apps import AppConfig
from django.apps import apps as global_apps
from django.db.models.signals import post_migrate


class TelemetryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "telemetry"
    verbose_name = "GPU telemetry"

    def ready(self) -> None:
        # Like scheduling's backstops: the rollup and retention schedules exist exactly once
        # after every migrate and flush.
        post_migrate.connect(_ensure_schedules, sender=self)


def _ensure_schedules(sender, using: str = "default", apps=global_apps, **kwargs) -> None:
    from telemetry import jobs

    try:
        schedule = apps.get_model("django_q", "Schedule")
    except LookupError:
        return
    jobs.schedules_ensure(schedule_model=schedule, using=using)
