"""How many PostgreSQL connections the platform's processes hold, and what each is called.

Every connection a platform process opens names the process in ``application_name``, so
``SELECT application_name, count(*) FROM pg_stat_activity GROUP BY 1`` tells an operator who
holds what: ``gpuplatform web`` (a web process's own pool), ``gpuplatform web channels`` (its
channel layer), ``gpuplatform scheduler`` (``manage.py scheduler``), ``gpuplatform
node_agent``, and other commands by name.

The most each role holds at once (``Budget``), measured with the throughput benchmark's
processes and read from their code:

- a web process: ``DB_POOL_SIZE`` for requests (its pool), and for websockets the channel
  layer's ``CHANNEL_POOL_SIZE`` plus the one connection that LISTENs;
- the scheduler (``manage.py scheduler``, ``gpuplatform.jobrunner``): one per worker thread
  (``Q_WORKERS``), and two for its main thread (the broker's claims and the schedules, and the
  LISTEN that wakes it: ``gpuplatform.broker``). django-q2's own cluster (``manage.py
  qcluster``), which an operator may run in its place, holds two more (its sentinel and its
  monitor);
- a node agent: its main loop, its GPU sampler's thread and its report relay's thread, one
  each, and two for its job thread (the queue's queries and the LISTEN that wakes it);
- the spawner holds none; a task's supervisor holds none while its agent relays its reports,
  and opens one only to write a report itself when the agent cannot be reached.

Nothing here imports Django: the settings use it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# The channel layer's own pool in each web process (channels_postgres: group membership, large
# messages, expiry), opened with one connection and grown on demand; its library default
# opened four at once.
CHANNEL_POOL_SIZE = 4
CHANNEL_LISTENERS = 1  # the connection each web process LISTENs on for channel messages
SCHEDULER_OWN = 2  # claims and schedules, and the LISTEN that wakes them, besides its workers
AGENT_OWN = 5  # main loop, GPU sampler, report relay, job thread (queries and LISTEN)


@dataclass(frozen=True)
class Budget:
    """The most connections a platform of this shape holds at once, by role."""

    web: int
    scheduler: int
    nodes: int
    node_count: int  # the nodes ``nodes`` is for

    @property
    def total(self) -> int:
        return self.web + self.scheduler + self.nodes


def budget(*, web_workers: int, db_pool_size: int, q_workers: int, nodes: int) -> Budget:
    """``web_workers`` web processes, one scheduler with ``q_workers`` worker threads, and
    ``nodes`` node agents."""
    return Budget(
        web=web_workers * (db_pool_size + CHANNEL_POOL_SIZE + CHANNEL_LISTENERS),
        scheduler=q_workers + SCHEDULER_OWN,
        nodes=nodes * AGENT_OWN,
        node_count=nodes,
    )


# What the server accepts from roles that are not superusers, as one SQL expression.
SERVER_ALLOWS = (
    "current_setting('max_connections')::int"
    " - current_setting('superuser_reserved_connections')::int"
)


def shortfall(cap: Budget, server_allows: int) -> str | None:
    """What to tell an operator whose PostgreSQL accepts fewer connections (``SERVER_ALLOWS``)
    than ``cap``; None when it fits."""
    if cap.total <= server_allows:
        return None
    return (
        f"PostgreSQL accepts {server_allows} connections (max_connections less the superuser "
        f"reserve), and {cap.node_count} node(s) with the web processes and the scheduler may hold "
        f"{cap.total} (web {cap.web}, scheduler {cap.scheduler}, nodes {cap.nodes}: "
        "gpuplatform/connections.py): raise max_connections, or the processes that connect "
        "last are refused ('too many clients already')"
    )


def budget_role(application_name: str) -> str | None:
    """The ``Budget`` field a session named by ``application_name`` counts in (web, scheduler,
    nodes), or None for a process outside the budget (a command, a client)."""
    role = application_name.removeprefix("gpuplatform ")
    if role == application_name:
        return None
    if role in ("web", "web channels"):
        return "web"
    if role in ("scheduler", "qcluster"):
        return "scheduler"
    if role.startswith("qcluster ") or role in ("node_agent", "supervisor"):
        return "nodes"
    return None


def application_name(web: bool, argv: list[str] | None = None, environ=None) -> str:
    """What this process's connections are called: ``gpuplatform <role>`` (at most 63 bytes,
    PostgreSQL's limit)."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if web:
        role = "web"
    elif len(argv) > 1 and Path(argv[0]).name == "manage.py":
        role = argv[1]
        if role == "qcluster" and environ.get("Q_CLUSTER_NAME"):
            role = f"qcluster {environ['Q_CLUSTER_NAME']}"
    else:
        script = Path(argv[0]) if argv and argv[0] else Path("python")
        role = script.parent.name if script.stem == "__main__" else script.stem  # python -m
        # The spawner itself never connects: a process with its argv is a supervisor it forked,
        # writing a report itself (Django is set up after the fork).
        role = "supervisor" if role == "spawner" else role
    return f"gpuplatform {role}".encode()[:63].decode(errors="ignore")
