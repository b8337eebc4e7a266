"""The backstop schedules belong to the platform: ``migrate`` makes them, once, without the demo
``bootstrap`` command."""

import pytest
from django.core.management import call_command
from django_q.models import Schedule

from scheduling import passes

pytestmark = pytest.mark.django_db

BACKSTOPS = {
    "mark-silent-nodes": "scheduling.tasks.mark_silent_nodes",
    "scheduling-pass-backstop": "scheduling.tasks.run_pass",
}


def backstops() -> list[tuple[str, str, str, int, int]]:
    return sorted(
        Schedule.objects.filter(name__in=BACKSTOPS).values_list(
            "name", "func", "schedule_type", "minutes", "repeats"
        )
    )


EXPECTED = sorted((name, func, Schedule.MINUTES, 1, -1) for name, func in BACKSTOPS.items())


def test_a_freshly_migrated_database_has_each_backstop_once():
    assert backstops() == EXPECTED


def test_migrating_twice_keeps_one_of_each():
    call_command("migrate", verbosity=0)
    call_command("migrate", verbosity=0)
    assert backstops() == EXPECTED


def test_bootstrap_is_not_needed_and_adds_none():
    call_command("bootstrap", "--no-demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert backstops() == EXPECTED


def test_duplicated_or_edited_backstops_are_repaired():
    Schedule.objects.filter(name="mark-silent-nodes").update(minutes=60, repeats=0)
    Schedule.objects.create(name="scheduling-pass-backstop", func="scheduling.tasks.run_pass")
    assert passes.backstops_ensure() == 0
    assert backstops() == EXPECTED
    Schedule.objects.filter(name__in=BACKSTOPS).delete()
    assert passes.backstops_ensure() == 2
    assert backstops() == EXPECTED
