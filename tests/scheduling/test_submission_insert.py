"""A submission's INSERT sends the columns its tasks share once and the others per task: what
it stores, and what it hands back, must be what each task's own spec says."""

from __future__ import annotations

import pytest

from scheduling import submission
from scheduling.models import Task, TaskEvent
from scheduling.spec import TaskSpec, parse_specs
from scheduling.submission import _own_columns, _same, task_submit, tasks_submit

pytestmark = pytest.mark.django_db


def stored(task: Task) -> dict:
    return {f.attname: getattr(task, f.attname) for f in Task._meta.concrete_fields}


def test_shared_and_own_columns_are_stored_as_each_spec_says(lab, owner, workstation):
    specs = [
        TaskSpec(name="a", command="python train.py", env={"LR": "0.1"}, priority=70),
        TaskSpec(name="b", command="python train.py", env={"LR": "0.2"}, gpus_min=2, gpus_max=2),
        TaskSpec(name="c", command="python eval.py", queue="serial", timeout_s=60, retries=2),
    ]
    created = tasks_submit(tenant=lab, specs=specs, owner=owner.user)

    assert [t.name for t in created] == ["a", "b", "c"]
    for task, spec in zip(created, specs, strict=True):
        in_db = Task.objects.get(pk=task.pk)
        assert stored(task) == stored(in_db)
        assert (in_db.command, in_db.env, in_db.spec) == (spec.command, spec.env, spec.as_dict())
        assert (in_db.priority, in_db.gpus_max, in_db.queue) == (
            spec.priority,
            spec.gpus_max,
            spec.queue,
        )
        assert (in_db.tenant_id, in_db.owner_id) == (lab.pk, owner.user.pk)
        assert in_db.reason == "submitted; waiting for the scheduler"
        assert not task._state.adding
    events = TaskEvent.objects.filter(task__in=created).values_list("task_id", "to_state")
    assert sorted(events) == sorted((t.pk, "pending") for t in created)


def test_one_task_is_stored_whole(lab, workstation):
    spec = TaskSpec(name="solo", command="sleep 1", env={"A": "1"}, workdir="runs")
    task = task_submit(tenant=lab, spec=spec)
    assert stored(task) == stored(Task.objects.get(pk=task.pk))
    assert task.spec == spec.as_dict() and task.owner is None


def test_identical_specs_share_every_column_and_still_make_a_task_each(lab, workstation):
    spec = TaskSpec(name="same", command="true", env={"A": "1"})
    created = tasks_submit(tenant=lab, specs=[spec, spec, spec])
    assert len({t.pk for t in created}) == 3
    for task in created:
        assert stored(task) == stored(Task.objects.get(pk=task.pk))


def test_the_tasks_handed_back_know_their_tenant_and_owner_without_a_query(
    lab, owner, workstation, django_assert_num_queries
):
    created = tasks_submit(
        tenant=lab, specs=[TaskSpec(name=f"t{i}", command="true") for i in range(3)],
        owner=owner.user,
    )  # fmt: skip
    with django_assert_num_queries(0):
        assert {(t.tenant.name, t.owner.username) for t in created} == {
            (lab.name, owner.user.username)
        }


def test_the_tasks_handed_back_act_as_tasks_loaded_from_the_database(lab, workstation):
    task = task_submit(tenant=lab, spec=TaskSpec(name="loaded", command="true"))
    assert task.get_deferred_fields() == set()
    assert (task._state.adding, task._state.db) == (False, "default")
    task.priority = 90
    task.save()  # an UPDATE of its row, not a second task
    assert Task.objects.filter(tenant=lab).count() == 1
    assert stored(task) == stored(Task.objects.get(pk=task.pk))


def test_values_that_compare_equal_but_write_differently_are_not_shared():
    assert _same([{}, {}]) and _same([[], []]) and not _same([{}, []])
    assert _same([{"x": "1"}, {"x": "1"}])
    assert not _same([{"x": 1}, {"x": True}])
    assert not _same([[1.0], [1]])
    assert _same([3, 3]) and not _same([3, 4])


def test_a_list_of_one_spec_under_many_names_stores_each_name_in_its_spec(lab, owner, workstation):
    """parse_specs hands such a list back as copies of one spec; the INSERT receives that spec
    once and writes each task's own name into it (_own_columns, _insert_sql's renamed)."""
    documents = [{"name": f"run-{i}", "command": "true", "env": {"A": "1"}} for i in range(4)]
    specs = parse_specs(documents)
    assert len({id(row["spec"]) for row in _own_columns(specs, {})}) == 1  # sent once

    created = tasks_submit(tenant=lab, specs=specs, owner=owner.user)

    for task, spec in zip(created, specs, strict=True):
        in_db = Task.objects.get(pk=task.pk)
        assert in_db.spec == spec.as_dict() == {**specs[0].as_dict(), "name": spec.name}
        assert stored(task) == stored(in_db)


def test_a_list_with_one_other_spec_stores_every_spec_whole(lab, workstation):
    """Not all copies of the first: every task's spec goes as it is (a shared spec would
    bear the first task's name)."""
    documents = [{"name": f"run-{i}", "command": "true"} for i in range(3)]
    specs = [*parse_specs(documents), TaskSpec(name="other", command="false")]
    assert len({id(row["spec"]) for row in _own_columns(specs, {})}) == 4

    created = tasks_submit(tenant=lab, specs=specs)

    for task, spec in zip(created, specs, strict=True):
        assert Task.objects.get(pk=task.pk).spec == spec.as_dict() == task.spec


def test_one_object_is_the_same_value_without_being_written(monkeypatch):
    shared = {"priority": 1}
    assert not _same([shared, {"priority": True}])  # equal, but not written alike

    def unwritten(*args, **kwargs):
        raise AssertionError("one object was written to compare it with itself")

    monkeypatch.setattr(submission.json, "dumps", unwritten)
    assert _same([shared, shared, shared])
