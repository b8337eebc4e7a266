"""A submission costs a constant number of statements, whatever the batch's size: also when
every task of a sweep names the same tasks in ``after``."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.spec import TaskSpec
from scheduling.submission import SubmitError, task_submit, tasks_submit
from tenants.models import Quota
from tests.api.conftest import bearer

pytestmark = pytest.mark.django_db


def sweep(count: int, after: list) -> list[TaskSpec]:
    return [TaskSpec(name=f"lr-{i}", command="true", after=after) for i in range(count)]


def statements(lab, specs) -> tuple[int, list]:
    with CaptureQueriesContext(connection) as queries:
        created = tasks_submit(tenant=lab, specs=specs)
    return len(queries), created


def test_after_costs_the_same_for_3_tasks_as_for_30(lab, workstation):
    prep = task_submit(tenant=lab, spec=TaskSpec(name="prep", command="true"))
    data = task_submit(tenant=lab, spec=TaskSpec(name="data", command="true"))

    few, small = statements(lab, sweep(3, ["prep", data.pk]))
    many, large = statements(lab, sweep(30, ["prep", data.pk]))

    assert few == many
    for task in (*small, *large):
        assert set(task.depends_on.values_list("pk", flat=True)) == {prep.pk, data.pk}


def test_a_name_means_the_latest_task_of_that_name_and_unknown_ones_are_refused(lab, workstation):
    task_submit(tenant=lab, spec=TaskSpec(name="prep", command="true"))
    latest = task_submit(tenant=lab, spec=TaskSpec(name="prep", command="true"))
    (task,) = tasks_submit(tenant=lab, specs=[TaskSpec(name="t", command="true", after=["prep"])])
    assert list(task.depends_on.values_list("pk", flat=True)) == [latest.pk]

    with pytest.raises(SubmitError) as refused:
        tasks_submit(tenant=lab, specs=[TaskSpec(name="u", command="true", after=["nope", 99999])])
    assert refused.value.errors["policy.after"] == [
        "no task nope in this tenant",
        "no task #99999 in this tenant",
    ]


def test_a_plain_submission_is_one_write_with_no_transaction_of_its_own(lab, workstation):
    """Its INSERT is atomic by itself: a transaction would only add BEGIN and COMMIT (here, in
    the test's transaction, a savepoint). Dependency links or a queue cap make the writes
    several, and those run in one transaction."""
    plain = statements_sql(lab, sweep(3, []))
    assert not any("SAVEPOINT" in sql for sql in plain)
    assert sum("INSERT INTO" in sql for sql in plain) == 1  # the tasks with their events

    linked = statements_sql(lab, sweep(3, ["lr-0"]))
    assert any("SAVEPOINT" in sql for sql in linked)

    Quota.objects.update_or_create(tenant=lab, pool=None, defaults={"max_queued_tasks": 100})
    capped = statements_sql(lab, sweep(3, []))
    lock = next(i for i, sql in enumerate(capped) if "pg_advisory_xact_lock" in sql)
    assert any("SAVEPOINT" in sql for sql in capped[:lock])


def statements_sql(lab, specs) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        tasks_submit(tenant=lab, specs=specs)
    return [query["sql"] for query in queries]


def test_a_submissions_statements_are_prepared_on_its_connection(owner, workstation):
    """The API's token read, rate step, estate read and INSERT are planned once per
    connection (settings' prepare_threshold), not on every submission: the most frequent
    request must not pay PostgreSQL's parser and planner each time."""
    client = bearer(owner.token)
    spec = {"command": "python train.py", "resources": {"gpus": 1}}
    for n in range(7):
        answer = client.post("/api/v1/tasks/", {"name": f"t{n}", **spec}, format="json")
        assert answer.status_code == 201, answer.content
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]
    for table in ("tenants_apitoken", "tenants_ratelimit", "scheduling_pool", "scheduling_task"):
        assert any(table in statement for statement in prepared), table
