"""gpuctl's commands that follow tasks: ``logs [-f]`` and ``wait``."""

from __future__ import annotations

import sys
import time
from typing import Any

from gpuctl import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from gpuctl import output as out
from gpuctl.client import ApiError, Client, CliError
from gpuctl.context import TERMINAL, Context

LOG_POLL_S = 1.0
# -f asks the server to hold a read with nothing new this long (``wait``): a new line comes at
# once. Reads that do bring bytes are spaced LOG_GAP_S apart, within the API's request rate.
LOG_WAIT_S = 20
LOG_GAP_S = 0.2
WAIT_POLL_S = 2.0


def read_log(
    client: Client, number: int, params: dict[str, Any], *, follow: bool = False
) -> dict | None:
    """One chunk of the log, or None when the attempt has no log (yet). While the node holding
    the log cannot be reached (503), -f says so once and asks again; without -f it fails."""
    said = ""
    while True:
        try:
            return client.get(f"tasks/{number}/log/", params, what=f"task {number}")
        except ApiError as exc:
            if exc.status == 404 and "attempt" in exc.errors:
                return None
            if not (exc.status == 503 and follow):
                raise
            if exc.detail != said:
                said = exc.detail
                out.note(f"task {number}: {exc.detail} (still trying)")
            time.sleep(LOG_POLL_S)


def cmd_logs(ctx: Context) -> int:
    """Print the log (all of it, or --tail N lines); with -f keep reading from next_offset until
    the attempt finishes. Without --attempt, -f goes on to the next attempt of a retried task."""
    client = ctx.client
    args = ctx.args
    number = args.id
    pinned = args.attempt
    if ctx.structured:
        if args.follow:
            raise CliError("-f prints text: -o json/yaml reads one chunk, without -f", EXIT_USAGE)
        params = {"attempt": pinned}
        params.update({"tail": args.tail} if args.tail is not None else {"offset": 0})
        chunk = read_log(client, number, params)
        if chunk is None:
            task = client.get(f"tasks/{number}/", what=f"task {number}")
            raise CliError(no_log_message(number, pinned, task), EXIT_NOT_FOUND)
        out.emit(out.dump(chunk, ctx.output))
        return EXIT_OK
    streaming: int | None = None  # the attempt being printed
    done_attempt = 0  # the last attempt printed to its end (-f goes on to the next one)
    offset = 0
    waiting_said = False
    asked = 0.0  # when the last read from an offset was sent
    while True:
        if streaming is None:
            chunk = None
            if done_attempt:  # ask the task first: re-reading the old attempt would be wasted
                task = client.get(f"tasks/{number}/", what=f"task {number}")
                if task["state"] in TERMINAL and task["attempt"] <= done_attempt:
                    return EXIT_OK
                if task["attempt"] > done_attempt:
                    params = {"attempt": task["attempt"], "offset": 0}
                    chunk = read_log(client, number, params, follow=True)
            else:
                params = {"attempt": pinned}
                params.update({"tail": args.tail} if args.tail is not None else {"offset": 0})
                chunk = read_log(client, number, params, follow=args.follow)
                if chunk is None:
                    task = client.get(f"tasks/{number}/", what=f"task {number}")
                    if not args.follow or task["state"] in TERMINAL:
                        raise CliError(no_log_message(number, pinned, task), EXIT_NOT_FOUND)
                    if not waiting_said:
                        out.note(f"waiting for task {number} to start ({task['state']})...")
                        waiting_said = True
            if chunk is None:
                time.sleep(LOG_POLL_S)
                continue
            if done_attempt:
                out.note(f"--- task {number}, attempt {chunk['attempt']} ---")
            streaming = chunk["attempt"]
        else:
            params = {"attempt": streaming, "offset": offset}
            if args.follow:
                params["wait"] = max(1, min(LOG_WAIT_S, int(client.timeout) - 5))
            asked = time.monotonic()
            chunk = read_log(client, number, params, follow=args.follow)
            if chunk is None:  # the log went away (cleaned up): nothing more to read
                return EXIT_OK
        sys.stdout.write(chunk["text"])
        sys.stdout.flush()
        offset = chunk["next_offset"]
        at_end = offset >= chunk["size"]
        if chunk["finished"] and at_end:
            if not args.follow or pinned is not None:
                return EXIT_OK
            done_attempt, streaming, offset = streaming, None, 0
        elif at_end and not args.follow:
            return EXIT_OK
        if at_end and streaming is None:  # between attempts
            time.sleep(LOG_POLL_S)
        elif at_end:  # the next read waits at the server: only space it from this one
            time.sleep(max(0.0, LOG_GAP_S - (time.monotonic() - asked)))


def no_log_message(number: int, attempt: int | None, task: dict) -> str:
    if attempt:
        return f"task {number}: no log for attempt {attempt}"
    if task["state"] in TERMINAL:
        return f"task {number}: no log: it is {task['state']} and never ran"
    return f"task {number}: no log yet: it is {task['state']} (use -f to wait for it)"


def cmd_wait(ctx: Context) -> int:
    return wait_for(ctx, ctx.args.ids)


def wait_for(ctx: Context, ids: list[int]) -> int:
    """Poll until every task has ended, telling each change on stderr; 0 if all succeeded."""
    client = ctx.client
    last: dict[int, str] = dict.fromkeys(ids, "")
    final: dict[int, dict] = {}
    while len(final) < len(ids):
        for number in ids:
            if number in final:
                continue
            task = client.get(f"tasks/{number}/", what=f"task {number}")
            if task["state"] != last[number]:
                last[number] = task["state"]
                where = f" on {task['node']}" if task.get("node") else ""
                why = (
                    f": {task['reason']}"
                    if task.get("reason") and task["state"] != "running"
                    else ""
                )
                out.note(f"task {number} {task['name']}: {task['state']}{where}{why}")
            if task["state"] in TERMINAL:
                final[number] = task
        if len(final) < len(ids):
            time.sleep(WAIT_POLL_S)
    ended = [final[n] for n in ids]
    if ctx.structured:
        out.emit(out.dump(ended if len(ended) != 1 else ended[0], ctx.output))
    failed = [t for t in ended if t["state"] != "succeeded"]
    for t in failed:
        code = f" (exit code {t['exit_code']})" if t.get("exit_code") is not None else ""
        out.note(f"error: task {t['id']} {t['name']} {t['state']}{code}")
    if not failed:
        out.note(f"{len(ended)} task(s) succeeded")
    return EXIT_FAILED if failed else EXIT_OK
