from django.apps import AppConfig
from django.apps import apps as global_apps
from django.db.models.signals import post_migrate


class SchedulingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "scheduling"

    def ready(self) -> None:
        # After every migrate (a fresh install, an upgrade) and every flush, as Django itself
        # does for content types and permissions: the backstop schedules exist exactly once.
        post_migrate.connect(_ensure_backstops, sender=self)
        # A django-q2 worker closes old connections before each job (a pass, a launch); the
        # connection it keeps is then checked without Django's SELECT 1 (gpuplatform.db).
        from django_q.signals import pre_execute

        from gpuplatform.db import check_kept_connections

        pre_execute.connect(check_kept_connections, dispatch_uid="check_kept_connections")


def _ensure_backstops(sender, using: str = "default", apps=global_apps, **kwargs) -> None:
    from scheduling import passes

    try:  # migrate passes the migrated state's models; flush passes none
        schedule = apps.get_model("django_q", "Schedule")
    except LookupError:  # django_q is not migrated (yet) on this database
        return
    passes.backstops_ensure(schedule_model=schedule, using=using)
