"""Node credentials of their own: a group role ``gpup_nodes`` and row-level security that lets
each member role (one per node, made by ``manage.py node_credential``) read and write only its
own node's rows. The platform's own role owns the tables and so bypasses these policies (no
FORCE): only node roles are held to them. Per-node roles are not made here: they belong to a
server, not to one database, and carry a password.

Role-independent: the group role (made if missing; that needs CREATEROLE, or a superuser to
run ``CREATE ROLE gpup_nodes NOLOGIN`` first), the mapping table, ``gpup_node_name()`` and
``gpup_node_id()`` (the node of the session's login role, by ``scheduling_nodecredential``),
the grants to the group, and the policies, all ``TO gpup_nodes``.
"""

import django.core.validators
import django.utils.timezone
from django.db import migrations, models

GROUP = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'gpup_nodes') THEN
        CREATE ROLE gpup_nodes NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;  -- made meanwhile by another database's
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'node credentials need the group role gpup_nodes, and this role may not '
                        'create it: as a superuser, run CREATE ROLE gpup_nodes NOLOGIN, then '
                        'migrate again';
END $$;
"""

# SECURITY DEFINER with a search path of its own (pg_catalog, then this schema only), so that
# no role can put a table of its own ahead of ours.
FUNCTIONS = """
DO $$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION gpup_node_name() RETURNS text
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, %1$I
            AS 'SELECT node_name FROM scheduling_nodecredential WHERE role = session_user';
        CREATE FUNCTION gpup_node_id() RETURNS bigint
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, %1$I
            AS 'SELECT n.id FROM scheduling_node n
                  JOIN scheduling_nodecredential c ON c.node_name = n.name
                 WHERE c.role = session_user';
    $f$, current_schema());
END $$;
REVOKE ALL ON FUNCTION gpup_node_name(), gpup_node_id() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpup_node_name(), gpup_node_id() TO gpup_nodes;
"""

# (table, privileges): what a node's processes do. Nothing else is granted: no API tokens, users,
# sessions, memberships, quotas, idempotency keys, successors or rollups.
GRANTS = (
    ("scheduling_pool", "SELECT, INSERT"),
    ("scheduling_node", "SELECT, INSERT, UPDATE"),
    ("scheduling_gpu", "SELECT, INSERT, UPDATE"),
    ("scheduling_task", "SELECT, UPDATE"),
    ("scheduling_taskattempt", "SELECT, INSERT, UPDATE"),
    ("scheduling_allocation", "SELECT, UPDATE"),
    ("scheduling_taskevent", "SELECT, INSERT"),
    ("scheduling_passrequest", "SELECT, INSERT, UPDATE"),
    ("scheduling_schedulerstate", "SELECT, UPDATE"),
    ("scheduling_tenantusage", "SELECT, INSERT, UPDATE"),
    ("tenants_tenant", "SELECT"),
    ("telemetry_gpusample", "SELECT, INSERT"),
    ("telemetry_xidrecord", "SELECT, INSERT"),
    ("telemetry_simulatedfault", "SELECT, UPDATE"),
    ("monitoring_alert", "SELECT, INSERT, UPDATE"),
    ("django_content_type", "SELECT"),
    ("django_q_ormq", "SELECT, INSERT, UPDATE, DELETE"),
    ("django_q_task", "SELECT, INSERT, UPDATE, DELETE"),
    ("django_q_schedule", "SELECT, UPDATE"),
    ("channels_postgres_groupchannel", "SELECT, DELETE"),
    ("channels_postgres_message", "SELECT, INSERT, DELETE"),
)

MINE = "(SELECT gpup_node_id())"
MY_NAME = "(SELECT gpup_node_name())"
MY_TASK = f"""(scheduling_task.node_id = {MINE} OR EXISTS (SELECT 1 FROM scheduling_taskattempt a
               WHERE a.task_id = scheduling_task.id AND a.node_id = {MINE}))"""  # noqa: S608 - constant
VISIBLE_TASK = "EXISTS (SELECT 1 FROM scheduling_task t WHERE t.id = {col})"
MY_GPU = f"EXISTS (SELECT 1 FROM scheduling_gpu g WHERE g.id = {{col}} AND g.node_id = {MINE})"  # noqa: S608
CONTROL_QUEUE = "NOT EXISTS (SELECT 1 FROM scheduling_node n WHERE n.name = django_q_ormq.key)"

# (table, policy name, command, USING, WITH CHECK): permissive policies for gpup_nodes. A table
# with row-level security and no policy for a command refuses it to them. Subqueries on other
# tables are held to those tables' policies too.
POLICIES = (
    # The estate's nodes (names, states) are the agent's to count; only its own row it writes.
    ("scheduling_node", "node_read", "SELECT", "true", None),
    ("scheduling_node", "node_add", "INSERT", None, f"name = {MY_NAME}"),
    ("scheduling_node", "node_write", "UPDATE", f"id = {MINE}", f"id = {MINE}"),
    ("scheduling_gpu", "gpu_own", "ALL", f"node_id = {MINE}", f"node_id = {MINE}"),
    ("scheduling_taskattempt", "attempt_own", "ALL", f"node_id = {MINE}", f"node_id = {MINE}"),
    # Tasks placed here, or with an attempt here (a requeued task's node is cleared).
    ("scheduling_task", "task_read", "SELECT", MY_TASK, None),
    ("scheduling_task", "task_write", "UPDATE", MY_TASK, MY_TASK),
    (
        "scheduling_allocation",
        "allocation_own",
        "ALL",
        MY_GPU.format(col="gpu_id"),
        MY_GPU.format(col="gpu_id"),
    ),  # fmt: skip
    (
        "scheduling_taskevent",
        "event_own",
        "ALL",
        VISIBLE_TASK.format(col="task_id"),
        VISIBLE_TASK.format(col="task_id"),
    ),  # fmt: skip
    (
        "telemetry_gpusample",
        "sample_own",
        "ALL",
        MY_GPU.format(col="gpu_id"),
        MY_GPU.format(col="gpu_id"),
    ),  # fmt: skip
    (
        "telemetry_xidrecord",
        "xid_own",
        "ALL",
        MY_GPU.format(col="gpu_id"),
        MY_GPU.format(col="gpu_id"),
    ),  # fmt: skip
    (
        "telemetry_simulatedfault",
        "fault_own",
        "ALL",
        MY_GPU.format(col="gpu_id"),
        MY_GPU.format(col="gpu_id"),
    ),  # fmt: skip
    (
        "monitoring_alert",
        "alert_own",
        "ALL",
        f"node_id = {MINE} OR {MY_GPU.format(col='gpu_id')}"
        f" OR {VISIBLE_TASK.format(col='task_id')}",
        f"node_id = {MINE} OR {MY_GPU.format(col='gpu_id')}"
        f" OR {VISIBLE_TASK.format(col='task_id')}",
    ),
    # django-q2: the node's own launch queue (its cluster is named after it), and the queues
    # of clusters that are no node's (the scheduler's: a pass, an alert's webhook), where it
    # may add a job and see it (Django reads back the id it inserted); never another node's.
    ("django_q_ormq", "queue_own", "ALL", f"key = {MY_NAME}", f"key = {MY_NAME}"),
    ("django_q_ormq", "queue_control_add", "INSERT", None, CONTROL_QUEUE),
    ("django_q_ormq", "queue_control_read", "SELECT", CONTROL_QUEUE, None),
    ("django_q_task", "result_own", "ALL", f"cluster = {MY_NAME}", f"cluster = {MY_NAME}"),
    ("django_q_schedule", "schedule_own", "ALL", f"cluster = {MY_NAME}", f"cluster = {MY_NAME}"),
    # Live events: a node sends to the groups and sweeps what expired; it reads no message
    # before it expires.
    ("channels_postgres_groupchannel", "groups_read", "SELECT", "true", None),
    ("channels_postgres_groupchannel", "groups_sweep", "DELETE", "expire < now()", None),
    ("channels_postgres_message", "message_send", "INSERT", None, "true"),
    ("channels_postgres_message", "message_read", "SELECT", "expire < now()", None),
    ("channels_postgres_message", "message_sweep", "DELETE", "expire < now()", None),
)


def _policies_sql() -> str:
    tables = sorted({table for table, *_ in POLICIES})
    lines = [f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;" for table in tables]
    for table, name, command, using, check in POLICIES:
        sql = f"CREATE POLICY gpup_{name} ON {table} FOR {command} TO gpup_nodes"
        if using is not None:
            sql += f" USING ({using})"
        if check is not None:
            sql += f" WITH CHECK ({check})"
        lines.append(sql + ";")
    return "\n".join(lines)


def _grants_sql() -> str:
    lines = [f"GRANT {privileges} ON {table} TO gpup_nodes;" for table, privileges in GRANTS]
    return "\n".join(lines)


def _undo_sql() -> str:
    lines = [f"DROP POLICY IF EXISTS gpup_{name} ON {table};" for table, name, *_ in POLICIES]
    lines += [
        f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;"
        for table in sorted({table for table, *_ in POLICIES})
    ]
    lines += [f"REVOKE ALL ON {table} FROM gpup_nodes;" for table, _ in GRANTS]
    lines.append("DROP FUNCTION gpup_node_id(); DROP FUNCTION gpup_node_name();")
    return "\n".join(lines)  # the group role stays: other databases on the server may use it


# django-q2 keeps its clusters' statistics in the default cache: a node's cluster writes its own
# there. The database cache's table is made by ``createcachetable``, here too (it is
# idempotent) so that it can be granted; nodes see none of its other keys (throttles).
DJANGO_Q_KEYS = "cache_key LIKE '%django_q:%'"  # no parameters: % is literal


def _cache_tables() -> list[str]:
    from django.conf import settings

    return [
        cache["LOCATION"]
        for cache in settings.CACHES.values()
        if cache["BACKEND"] == "django.core.cache.backends.db.DatabaseCache"
    ]


def cache_for_nodes(apps, schema_editor) -> None:
    from django.core.management import call_command

    if not _cache_tables():
        return
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)
    with schema_editor.connection.cursor() as cursor:
        for table in map(schema_editor.quote_name, _cache_tables()):
            cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO gpup_nodes")
            cursor.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            cursor.execute(
                f"CREATE POLICY gpup_django_q_stats ON {table} TO gpup_nodes"
                f" USING ({DJANGO_Q_KEYS}) WITH CHECK ({DJANGO_Q_KEYS})"
            )


def cache_for_nodes_undo(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        for table in map(schema_editor.quote_name, _cache_tables()):
            cursor.execute(f"DROP POLICY IF EXISTS gpup_django_q_stats ON {table}")
            cursor.execute(f"ALTER TABLE IF EXISTS {table} DISABLE ROW LEVEL SECURITY")
            cursor.execute(f"REVOKE ALL ON {table} FROM gpup_nodes")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0028_passrequest_started"),
        ("tenants", "0004_rate_limit_pace"),
        ("telemetry", "0001_initial"),
        ("monitoring", "0003_alert_kinds_gpu_telemetry"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
        ("channels_postgres", "0004_notify_ensure_payload_not_too_big"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.CreateModel(
            name="NodeCredential",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),  # fmt: skip
                (
                    "node_name",
                    models.CharField(
                        max_length=63,
                        unique=True,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                                "Use lowercase letters, digits and inner dashes (at most 63 "
                                "characters).",
                            )
                        ],
                    ),
                ),
                ("role", models.CharField(max_length=63, unique=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("rotated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.RunSQL(GROUP, reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL(FUNCTIONS + _grants_sql() + _policies_sql(), reverse_sql=_undo_sql()),
        migrations.RunPython(cache_for_nodes, cache_for_nodes_undo),
    ]
