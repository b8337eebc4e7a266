"""Run one scheduling pass now and print what it did: ``python manage.py schedule_pass``."""

from django.core.management.base import BaseCommand

from scheduling import scheduler


class Command(BaseCommand):
    help = "Run one scheduling pass now (waits for a pass already running elsewhere)."

    def handle(self, *args, **options):
        result = scheduler.schedule_pass()
        self.stdout.write(
            f"{len(result.placed)} placed, {len(result.preempted)} preempted, "
            f"{len(result.failed)} failed on dependencies, {result.waiting} waiting "
            f"({result.ms:.1f} ms)"
        )
