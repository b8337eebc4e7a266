"""gpuctl's command line: argparse in front, one function per command behind (gpuctl.commands).

Like kubectl: ``gpuctl get tasks``, ``gpuctl describe task 12``, ``gpuctl logs -f 12``; like
Slurm's srun/sbatch: ``gpuctl run --gpus 2 -- python train.py`` and ``gpuctl submit -f
spec.yaml``. Tables for people by default, ``-o json`` / ``-o yaml`` (the API's data) for scripts.

Exit codes scripts can rely on (also in ``gpuctl --help``):

    0    ok
    1    the API refused the request (a 4xx not listed below, e.g. a bad spec; 429 after retries),
         the server failed (5xx), or a task did not succeed while waiting for it (--wait, wait)
    2    usage error (bad arguments, unreadable spec file, -o yaml without PyYAML)
    3    cannot connect to the server
    4    authentication: not logged in, token rejected (401) or role not allowed (403)
    5    not found (404): no such task (another tenant's included), node, token or log
    6    conflict (409): the task's state does not allow the action (cancel twice, ...)
    130  interrupted (Ctrl-C)

Errors are one-liners on stderr (``error: resources.gpus: must be ...``), never a traceback;
``--debug`` shows the HTTP requests and, on failure, the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from gpuctl import EXIT_CODES_HELP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, __version__
from gpuctl import output as out
from gpuctl.client import CliError
from gpuctl.commands import logs, session, submit, tasks, telemetry, tenant
from gpuctl.context import Context, env_pair, non_negative, positive, task_id

ENVIRONMENT_HELP = """\
environment:
  GPUCTL_URL     server URL (overrides the config file; --url overrides it)
  GPUCTL_TOKEN   API token (overrides the config file; --token overrides it)
  GPUCTL_CONFIG  config file (default ~/.config/gpuctl/config.json, written by gpuctl login)"""

EXAMPLES_HELP = """\
examples:
  gpuctl login --url http://gpu-server:8000 --token gpup_...
  gpuctl run --gpus 2 --gpu-memory 20Gi --timeout 6h -- python train.py --lr 0.01
  gpuctl submit -f sweep.yaml --wait
  gpuctl get tasks --state pending,running
  gpuctl describe task 12
  gpuctl logs -f 12"""


# --- Parser --------------------------------------------------------------------------------------


class _ParseFailed(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that can be asked to raise instead of exiting (to try a split at ``--``)."""

    trial = False

    def error(self, message: str):
        if Parser.trial:
            raise _ParseFailed(message)
        super().error(message)


def build_parser() -> Parser:
    common = Parser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument("--url", default=argparse.SUPPRESS, help="server URL (else GPUCTL_URL)")
    group.add_argument(
        "--token", default=argparse.SUPPRESS, help="API token (else GPUCTL_TOKEN; prefer those)"
    )
    group.add_argument(
        "-o",
        "--output",
        choices=out.FORMATS,
        default=argparse.SUPPRESS,
        help="table (default), wide, json or yaml (json/yaml: the API's data)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show HTTP requests, and tracebacks on errors",
    )
    parser = Parser(
        prog="gpuctl",
        description="Command-line client for gpuplatform: submit and follow GPU tasks.",
        epilog=f"{EXAMPLES_HELP}\n\n{ENVIRONMENT_HELP}\n\n{EXIT_CODES_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"gpuctl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Callable[[Context], int], help_text: str, **kwargs: Any):
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[common],
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )
        sub.set_defaults(func=func)
        return sub

    command(
        "login", session.cmd_login, "check a token against the server and save both (mode 0600)"
    )
    command("logout", session.cmd_logout, "remove the saved token")
    command("whoami", session.cmd_whoami, "show the user and tenant the token acts for")

    sub = command("submit", submit.cmd_submit, "submit tasks from a YAML or JSON file")
    sub.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="spec file, or - for stdin"
    )
    sub.add_argument(
        "--wait", action="store_true", help="wait until the tasks end (exit 1 if any failed)"
    )

    sub = command(
        "run",
        submit.cmd_run,
        "submit one task built from flags: gpuctl run [options] -- CMD [ARGS...]",
        usage="gpuctl run [options] -- CMD [ARGS...]",
    )
    sub.add_argument("--name", help="task name (default: the command's first word)")
    sub.add_argument("--gpus", help="GPUs: 2, or a range like 1-4 (elastic), 0 for CPU only")
    sub.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, shares cards: 20Gi")
    sub.add_argument("--gpu-type", metavar="TYPE", help="e.g. rtx4090-24g")
    sub.add_argument("--pool")
    sub.add_argument("--node")
    sub.add_argument("--priority", help="low, normal, high or 0-100")
    sub.add_argument("--class", dest="task_class", choices=("batch", "online"))
    sub.add_argument("--queue", help="serial queue: one task at a time per queue")
    sub.add_argument("--timeout", metavar="DURATION", help="e.g. 6h, 1h30m")
    sub.add_argument("--retries", type=non_negative)
    sub.add_argument(
        "--after", action="append", metavar="TASK", help="start after this task succeeded"
    )
    sub.add_argument(
        "--env", "-e", action="append", type=env_pair, metavar="NAME=VALUE", help="repeatable"
    )
    sub.add_argument("--workdir", metavar="DIR", help="relative to the tenant's root directory")
    sub.add_argument(
        "--port", metavar="PORT", help="a service: auto (a free port, as $PORT) or a number"
    )
    sub.add_argument("--health", metavar="PATH", help="a service's health check path: /health")
    sub.add_argument("--replicas", type=non_negative, help="a service's replicas")
    sub.add_argument("--wait", action="store_true", help="wait until it ends (exit 1 if it failed)")
    sub.add_argument("--dry-run", action="store_true", help="print the spec, submit nothing")
    sub.add_argument("cmd", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    sub = command(
        "get", tasks.cmd_get, "list tasks, gpus, nodes or pools (or show some by id/name)"
    )
    sub.add_argument(
        "resource", choices=("tasks", "task", "gpus", "gpu", "nodes", "node", "pools", "pool")
    )
    sub.add_argument("names", nargs="*", metavar="ID", help="task ids, GPU ids, node names")
    sub.add_argument("--state", action="append", help="tasks in these states: pending,running")
    sub.add_argument("--queue", help="tasks of this queue")
    sub.add_argument("--name", help="tasks whose name contains this")
    sub.add_argument("-l", "--limit", type=positive, default=50, help="at most N tasks (50)")
    sub.add_argument("-A", "--all", action="store_true", help="every task (all pages)")

    sub = command(
        "describe", tasks.cmd_describe, "a task in detail: why it waits, attempts, events"
    )
    sub.add_argument("resource", choices=("task", "tasks"))
    sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")

    sub = command("logs", logs.cmd_logs, "print a task's output")
    sub.add_argument("id", type=task_id, metavar="ID")
    sub.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    sub.add_argument("--tail", type=non_negative, metavar="N", help="only the last N lines")
    sub.add_argument("--attempt", type=positive, metavar="N", help="this attempt (default: latest)")

    for action, text in (
        ("cancel", "cancel tasks (stops them if running)"),
        ("pause", "pause running tasks (SIGSTOP; they keep their GPUs)"),
        ("resume", "resume paused tasks"),
        ("retry", "run ended tasks again"),
    ):
        sub = command(action, tasks.cmd_control, text)
        sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")
        sub.set_defaults(action=action)

    sub = command("wait", logs.cmd_wait, "wait until tasks end (exit 1 if any did not succeed)")
    sub.add_argument("ids", nargs="+", type=task_id, metavar="ID")

    command("quota", tenant.cmd_quota, "your tenant's limits, what it uses now, its fair share")
    sub = command("usage", tenant.cmd_usage, "GPU-hours per day")
    sub.add_argument("--days", type=positive, default=30, help="how many days back (30)")
    sub.add_argument(
        "--sampled",
        action="store_true",
        help="per member: GPU-hours held, used (utilisation-weighted) and idle, from samples",
    )
    telemetry.add_commands(command)

    token = commands.add_parser(
        "token",
        help="create, list and revoke API tokens",
        description="create, list and revoke API tokens",
        parents=[common],
    )
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    for name, func, help_text in (
        ("create", session.cmd_token_create, "create a token (its secret is printed once)"),
        ("list", session.cmd_token_list, "your tokens in this tenant"),
        ("revoke", session.cmd_token_revoke, "revoke tokens by id"),
    ):
        sub = token_commands.add_parser(
            name, help=help_text, description=help_text, parents=[common]
        )
        sub.set_defaults(func=func)
        if name == "create":
            sub.add_argument("name")
            sub.add_argument("--days", type=positive, help="expires after N days (default never)")
        elif name == "revoke":
            sub.add_argument("ids", nargs="+", type=positive, metavar="ID")
    return parser


def parse_args(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """argparse, except that for ``run`` everything after the first ``--`` is the command, taken
    as it is (options to the command are never read as gpuctl's)."""
    if "--" in argv:
        cut = argv.index("--")
        Parser.trial = True
        try:
            args = parser.parse_args(argv[:cut])
        except _ParseFailed:
            args = None
        finally:
            Parser.trial = False
        if args is not None and args.command == "run":
            tail = argv[cut + 1 :]
            args.cmd = [*args.cmd, "--", *tail] if args.cmd else tail
            return args
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    debug = "--debug" in head
    try:
        args = parse_args(build_parser(), argv)
        return int(args.func(Context(args)) or EXIT_OK)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else 2)
    except CliError as exc:
        if debug:
            traceback.print_exc()
        for line in exc.message.splitlines() or [""]:
            print(f"error: {line}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (gpuctl logs 12 | head): stop quietly, and keep Python from
        # complaining again while it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(
            f"error: unexpected failure: {type(exc).__name__}: {exc} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
