"""A node's own database credential (``manage.py node_credential``): a real second connection
as the node's role reads and writes its node's rows, and nothing of other nodes' or tenants'."""

from __future__ import annotations

import io
import os
import stat
from urllib.parse import urlsplit

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from psycopg import errors

from scheduling import scheduler
from scheduling.models import NodeCredential, TaskAttempt
from scheduling.spec import TaskSpec
from scheduling.submission import task_submit
from tests.factories import (
    MembershipFactory,
    NodeFactory,
    TaskFactory,
    TenantFactory,
    make_gpus,
    make_token,
)

pytestmark = pytest.mark.django_db(transaction=True)

# Roles belong to the server, not to the test database: names of this run's own.
MINE, OTHER = f"cred-a-{os.getpid()}", f"cred-b-{os.getpid()}"


def issue(action: str, node: str, tmp_path) -> str:
    path = tmp_path / f"{node}.url"
    call_command("node_credential", action, node, "--output", str(path), stderr=io.StringIO())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_text().strip()


@pytest.fixture
def estate(tmp_path):
    """Two nodes with a task each, placed by a pass, with an attempt; a pending task; a token."""
    nodes = {name: NodeFactory(name=name) for name in (MINE, OTHER)}
    gpus = {name: make_gpus(node, count=2) for name, node in nodes.items()}
    lab, rival = TenantFactory(name="lab"), TenantFactory(name="rival")
    member = MembershipFactory(tenant=lab).user
    token = make_token(user=member, tenant=lab)
    tasks = {
        MINE: task_submit(tenant=lab, spec=TaskSpec(name="here", command="true", node=MINE)),
        OTHER: task_submit(tenant=rival, spec=TaskSpec(name="there", command="true", node=OTHER)),
    }
    scheduler.schedule_pass()
    attempts = {}
    for name, task in tasks.items():
        task.refresh_from_db()
        assert task.node_id == nodes[name].pk, task.reason
        attempts[name] = TaskAttempt.objects.create(task=task, number=1, node=nodes[name])
    waiting = TaskFactory(tenant=rival, name="waiting", command="secret-sauce")
    url = issue("create", MINE, tmp_path)
    yield {
        "nodes": nodes, "gpus": gpus, "tasks": tasks, "attempts": attempts,
        "waiting": waiting, "token": token, "url": url,
    }  # fmt: skip
    for name in (MINE, OTHER):
        call_command("node_credential", "revoke", name, stdout=io.StringIO())


@pytest.fixture
def as_node(estate):
    with psycopg.connect(estate["url"], autocommit=True) as conn:
        yield conn


def ids(conn, sql: str, *params) -> set[int]:
    return {row[0] for row in conn.execute(sql, params).fetchall()}


def refused(conn, sql: str, *params) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute(sql, params)


def test_it_logs_in_as_the_nodes_own_role_mapped_to_its_node(estate, as_node):
    role = as_node.execute("SELECT session_user").fetchone()[0]
    assert (
        role == NodeCredential.objects.get(node_name=MINE).role == f"gpup_node_cred_a_{os.getpid()}"
    )
    assert as_node.execute("SELECT gpup_node_name()").fetchone()[0] == MINE


@pytest.mark.parametrize(
    "table", ["tenants_apitoken", "auth_user", "django_session", "tenants_quota",
              "tenants_membership", "scheduling_successor", "scheduling_idempotencykey"],
)  # fmt: skip
def test_it_cannot_read_what_no_node_needs(estate, as_node, table):
    refused(as_node, f"SELECT * FROM {table}")  # noqa: S608 - a test's own names


def test_it_reads_only_the_tasks_and_attempts_placed_on_its_node(estate, as_node):
    assert ids(as_node, "SELECT id FROM scheduling_task") == {estate["tasks"][MINE].pk}
    assert ids(as_node, "SELECT id FROM scheduling_taskattempt") == {estate["attempts"][MINE].pk}
    assert not ids(
        as_node, "SELECT id FROM scheduling_task WHERE id = %s", estate["waiting"].pk
    )  # a tenant's spec beyond the attempts placed here
    assert ids(as_node, "SELECT id FROM scheduling_taskevent") == set(
        estate["tasks"][MINE].events.values_list("pk", flat=True)
    )
    mine = {gpu.pk for gpu in estate["gpus"][MINE]}
    assert ids(as_node, "SELECT id FROM scheduling_gpu") == mine
    allocated = ids(as_node, "SELECT gpu_id FROM scheduling_allocation")
    assert allocated and allocated <= mine


def test_it_cannot_change_another_nodes_rows(estate, as_node):
    other, task = estate["nodes"][OTHER], estate["tasks"][OTHER]
    for sql, param in [
        ("UPDATE scheduling_node SET hostname = 'owned' WHERE id = %s", other.pk),
        ("UPDATE scheduling_gpu SET state = 'failed' WHERE node_id = %s", other.pk),
        ("UPDATE scheduling_task SET command = 'evil' WHERE id = %s", task.pk),
        ("UPDATE scheduling_taskattempt SET pid = 1 WHERE task_id = %s", task.pk),
        ("DELETE FROM scheduling_taskattempt WHERE task_id = %s", task.pk),
    ]:
        if sql.startswith("DELETE"):
            refused(as_node, sql, param)  # no node deletes an attempt
        else:
            assert as_node.execute(sql, (param,)).rowcount == 0, sql
    other.refresh_from_db()
    assert other.hostname != "owned"
    # Nor move its own rows to another node.
    refused(
        as_node,
        "UPDATE scheduling_gpu SET node_id = %s WHERE node_id = %s",
        other.pk,
        estate["nodes"][MINE].pk,
    )
    refused(
        as_node,
        "INSERT INTO telemetry_gpusample (gpu_id, at, simulated, lost, processes)"
        " VALUES (%s, now(), true, false, '[]')",
        estate["gpus"][OTHER][0].pk,
    )


def test_it_writes_what_its_agent_writes(estate, as_node):
    node = estate["nodes"][MINE]
    assert (
        as_node.execute(
            "UPDATE scheduling_node SET last_heartbeat = now() WHERE id = %s", (node.pk,)
        ).rowcount
        == 1
    )
    assert (
        as_node.execute(
            "UPDATE scheduling_gpu SET foreign_memory_mb = 0 WHERE node_id = %s", (node.pk,)
        ).rowcount
        == 2
    )
    as_node.execute(
        "INSERT INTO telemetry_gpusample (gpu_id, at, simulated, lost, processes)"
        " VALUES (%s, now(), true, false, '[]')",
        (estate["gpus"][MINE][0].pk,),
    )
    assert (
        as_node.execute(
            "UPDATE scheduling_taskattempt SET pid = 4242 WHERE id = %s",
            (estate["attempts"][MINE].pk,),
        ).rowcount
        == 1
    )


def test_rotation_gives_a_new_password_and_keeps_the_role(estate, tmp_path):
    before = NodeCredential.objects.get(node_name=MINE)
    hashes = "SELECT rolpassword FROM pg_authid WHERE rolname = %s"
    with connection.cursor() as cursor:
        cursor.execute(hashes, [before.role])
        old_hash = cursor.fetchone()[0]
        url = issue("rotate", MINE, tmp_path)
        cursor.execute(hashes, [before.role])
        new_hash = cursor.fetchone()[0]
    assert url != estate["url"]
    assert old_hash.startswith("SCRAM-SHA-256$") and new_hash != old_hash
    after = NodeCredential.objects.get(node_name=MINE)
    assert (after.role, after.created_at) == (before.role, before.created_at)
    assert after.rotated_at > before.rotated_at


def test_create_again_is_idempotent_but_for_the_password(estate, tmp_path):
    issue("create", MINE, tmp_path)
    assert NodeCredential.objects.filter(node_name=MINE).count() == 1


def test_revoke_drops_the_role(estate):
    role = NodeCredential.objects.get(node_name=MINE).role
    out = io.StringIO()
    call_command("node_credential", "revoke", MINE, stdout=out)
    assert f"role {role} dropped" in out.getvalue()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        assert cursor.fetchone() is None
    assert not NodeCredential.objects.filter(node_name=MINE).exists()


def test_it_refuses_to_rotate_a_credential_never_made(db):
    with pytest.raises(CommandError, match="has no credential"):
        call_command("node_credential", "rotate", "nowhere", stdout=io.StringIO())


def test_it_refuses_a_bad_node_name(db):
    with pytest.raises(CommandError, match="node: Use lowercase"):
        call_command("node_credential", "create", "Bad_Name", stdout=io.StringIO())


def test_it_releases_its_allocations_and_the_fair_share_counters_follow(estate, as_node):
    """The release trigger runs as the node's role: it reads the scheduler's state and adds to
    the tenant's counters, which the role may do though it may not read the quotas."""
    from scheduling.models import SchedulerState, TenantUsage

    SchedulerState.objects.update_or_create(pk=1, defaults={"fair_share_half_life_s": 3600})
    task = estate["tasks"][MINE]
    released = as_node.execute(
        "UPDATE scheduling_allocation SET released_at = now() + interval '1 minute'"
        " WHERE task_id = %s AND released_at IS NULL",
        (task.pk,),
    ).rowcount
    assert released == 1
    assert TenantUsage.objects.get(tenant=task.tenant).closed > 0


def test_it_sends_live_events_but_reads_no_message_before_it_expires(estate, as_node):
    """What channels_postgres does for a node's ``group_send``: read the group's channels and
    insert a message for each; the platform's own messages stay unread."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO channels_postgres_groupchannel (group_key, channel, expire)"
            " VALUES ('ops', 'browser-1', now() + interval '1 day')"
        )
        cursor.execute(
            "INSERT INTO channels_postgres_message (channel, message, expire)"
            " VALUES ('browser-1', 'secret', now() + interval '1 day')"
        )
    rows = as_node.execute(
        "SELECT DISTINCT group_key, channel FROM channels_postgres_groupchannel"
        " WHERE group_key = 'ops'"
    ).fetchall()
    assert rows == [("ops", "browser-1")]
    as_node.execute(
        "INSERT INTO channels_postgres_message (channel, message, expire)"
        " VALUES ('browser-1', 'sample', now() + interval '1 minute')"
    )
    assert as_node.execute("SELECT message FROM channels_postgres_message").fetchall() == []


def test_it_queues_a_pass_but_reads_no_other_nodes_queue(estate, as_node):
    from django_q.models import OrmQ

    OrmQ.objects.create(key=OTHER, payload="launch", lock=None)
    as_node.execute(
        "INSERT INTO django_q_ormq (key, payload) VALUES ('gpuplatform', 'pass') RETURNING id"
    )
    refused(as_node, "INSERT INTO django_q_ormq (key, payload) VALUES (%s, 'forged')", OTHER)
    keys = {row[0] for row in as_node.execute("SELECT key FROM django_q_ormq").fetchall()}
    assert keys == {"gpuplatform"}


def test_it_prints_the_url_with_the_address_the_node_reaches_the_server_on(db):
    node = f"cred-c-{os.getpid()}"
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(
            "node_credential", "create", node, "--host", "db.lab.example", "--port", "6543",
            stdout=out, stderr=err,
        )  # fmt: skip
    finally:
        call_command("node_credential", "revoke", node, stdout=io.StringIO())
    url = urlsplit(out.getvalue().strip())
    database = connection.settings_dict["NAME"]
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "postgres", "db.lab.example", 6543, f"/{database}",
    )  # fmt: skip
    assert url.username == f"gpup_node_cred_c_{os.getpid()}" and len(url.password) >= 40
    assert f"created role {url.username}" in err.getvalue()


def test_it_sees_only_django_q2_statistics_in_the_cache(estate, as_node):
    from django.core.cache import cache

    cache.clear()  # what clusters of other tests left (the cache table is not flushed)
    cache.set("throttle_user_1", [1, 2, 3])
    as_node.execute(
        "INSERT INTO gpuplatform_cache (cache_key, value, expires)"
        " VALUES (':1:django_q:gpuplatform:cluster:x', 'stat', now() + interval '1 minute')"
    )
    keys = {row[0] for row in as_node.execute("SELECT cache_key FROM gpuplatform_cache")}
    assert keys == {":1:django_q:gpuplatform:cluster:x"}
    refused(
        as_node,
        "INSERT INTO gpuplatform_cache (cache_key, value, expires)"
        " VALUES (':1:throttle_user_2', 'x', now() + interval '1 minute')",
    )


@pytest.fixture
def as_a_platform_role_that_is_no_superuser(db):
    """This connection as a role like docs/multi-host.md's ``gpuplatform``: CREATEROLE and
    pg_signal_backend, no superuser (the test server's own login is one). PostgreSQL checks the
    current role."""
    admin = f"cred-admin-{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{admin}" NOLOGIN CREATEROLE IN ROLE pg_signal_backend')
        cursor.execute(f'GRANT ALL ON {NodeCredential._meta.db_table} TO "{admin}"')
        cursor.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{admin}"')
        cursor.execute(
            f'GRANT CONNECT ON DATABASE "{connection.settings_dict["NAME"]}" TO "{admin}" '
            "WITH GRANT OPTION"
        )
        cursor.execute(f'SET ROLE "{admin}"')
    try:
        yield admin
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f'SET ROLE "{admin}"')  # again, where the test's transaction broke
        try:  # what the test left (it revokes itself): as the role that granted it
            call_command("node_credential", "revoke", MINE, stdout=io.StringIO())
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET ROLE")
                cursor.execute(f'DROP OWNED BY "{admin}"')
                cursor.execute(f'DROP ROLE "{admin}"')


def test_a_platform_role_that_is_no_superuser_creates_rotates_and_revokes(
    as_a_platform_role_that_is_no_superuser, tmp_path
):
    """PostgreSQL refuses such a role an ALTER ROLE that names SUPERUSER, REPLICATION or
    BYPASSRLS at all, and DROP OWNED BY a role it is not a member of: creating again, rotating
    and revoking used to fail here."""
    urls = [issue(action, MINE, tmp_path) for action in ("create", "create", "rotate")]
    assert len(set(urls)) == 3
    role = urlsplit(urls[-1]).username
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, rolsuper, rolreplication, rolbypassrls, rolcanlogin"
                       " FROM pg_roles WHERE rolname = %s", [role])  # fmt: skip
        (user, *attributes) = cursor.fetchone()
    assert user == as_a_platform_role_that_is_no_superuser
    assert attributes == [False, False, False, True]
    with psycopg.connect(urls[-1], autocommit=True) as agent:
        assert agent.execute("SELECT current_user").fetchone()[0] == role
        out, err = io.StringIO(), io.StringIO()
        call_command("node_credential", "revoke", MINE, stdout=out, stderr=err)
        assert f"role {role} dropped" in out.getvalue() and not err.getvalue()
        with pytest.raises(psycopg.OperationalError):  # its session was ended
            agent.execute("SELECT 1")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        assert cursor.fetchone() is None
