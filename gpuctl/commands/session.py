"""gpuctl's session commands: ``login``, ``logout``, ``whoami`` and ``token create|list|revoke``."""

from __future__ import annotations

import getpass
import os
import sys
from typing import Any

from gpuctl import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from gpuctl import output as out
from gpuctl.client import ApiError, Client, CliError, config_path, load_config, save_config
from gpuctl.context import STDIN, Context


def cmd_login(ctx: Context) -> int:
    args = ctx.args
    url = getattr(args, "url", None) or os.environ.get("GPUCTL_URL") or load_config().get("url")
    if not url:
        raise CliError("login needs the server: gpuctl login --url URL --token TOKEN", EXIT_USAGE)
    token = getattr(args, "token", None) or os.environ.get("GPUCTL_TOKEN")
    if not token or token == STDIN:
        token = read_secret("API token: ")
    client = Client(url, token.strip(), debug=ctx.debug)
    try:
        me = client.get("me/")
    except ApiError as exc:
        if exc.status == 404:
            raise CliError(
                f"no gpuplatform API at {client.base} (404 on {client.url_for('me/')})",
                EXIT_NOT_FOUND,
            ) from exc
        raise
    if not isinstance(me, dict) or "username" not in me:
        raise CliError(f"{client.base} answered, but not like a gpuplatform server")
    config = load_config()
    config.update(url=client.base, token=client.token)
    path = save_config(config)
    if ctx.structured:
        out.emit(out.dump(me, ctx.output))
    else:
        tenant = f" in tenant {me['tenant']}" if me.get("tenant") else ""
        out.emit(f"logged in to {client.base} as {me['username']}{tenant}")
        out.note(f"saved to {path} (readable by you only)")
    return EXIT_OK


def read_secret(prompt: str) -> str:
    if sys.stdin.isatty():
        secret = getpass.getpass(prompt)
    else:
        secret = sys.stdin.readline()
    secret = secret.strip()
    if not secret:
        raise CliError("no token given: gpuctl login --url URL --token TOKEN", EXIT_USAGE)
    return secret


def cmd_logout(ctx: Context) -> int:
    path = config_path()
    config = load_config()
    if "token" not in config:
        out.note(f"not logged in ({path} holds no token)")
        return EXIT_OK
    del config["token"]
    save_config(config)
    out.emit(f"logged out: token removed from {path}")
    return EXIT_OK


def cmd_whoami(ctx: Context) -> int:
    me = ctx.client.get("me/")

    def human() -> str:
        memberships = ", ".join(f"{m['tenant']} ({m['role']})" for m in me.get("memberships", []))
        return out.fields(
            [
                ("Server", ctx.client.base),
                ("User", me.get("username")),
                ("Tenant", me.get("tenant")),
                ("Token", me.get("token")),
                ("Operator", bool(me.get("is_operator"))),
                ("Memberships", memberships),
            ]
        )

    ctx.show(me, human)
    return EXIT_OK


def cmd_token_create(ctx: Context) -> int:
    body: dict[str, Any] = {"name": ctx.args.name}
    if ctx.args.days:
        body["expires_in_days"] = ctx.args.days
    token = ctx.client.post("tokens/", body, what="token")
    if ctx.structured:
        out.emit(out.dump(token, ctx.output))
    else:
        out.emit(token["token"])
        expires = (
            f"expires {out.local_time(token['expires_at'])}"
            if token.get("expires_at")
            else "never expires"
        )
        out.note(f"token {token['name']!r} created (id {token['id']}, {expires}).")
        out.note(
            "This is the only time the secret is shown: store it now; the server keeps a hash."
        )
    return EXIT_OK


def cmd_token_list(ctx: Context) -> int:
    tokens = ctx.client.list("tokens/").items

    def human() -> str:
        rows = []
        for t in tokens:
            expires = out.parse_time(t.get("expires_at"))
            if t.get("revoked_at"):
                status = "revoked"
            elif expires and expires <= out.now():
                status = "expired"
            else:
                status = "active"
            rows.append(
                [
                    t["id"],
                    t["name"],
                    t["prefix"],
                    status,
                    out.age(t.get("created_at")),
                    out.local_time(t.get("expires_at")) if expires else "never",
                    f"{out.age(t['last_used_at'])} ago" if t.get("last_used_at") else "never",
                ]
            )
        headers = ["ID", "NAME", "PREFIX", "STATUS", "AGE", "EXPIRES", "LAST-USED"]
        return out.table(headers, rows)

    if not tokens and not ctx.structured:
        out.note("no tokens")
        return EXIT_OK
    ctx.show(tokens, human)
    return EXIT_OK


def cmd_token_revoke(ctx: Context) -> int:
    code = EXIT_OK
    for number in ctx.args.ids:
        try:
            ctx.client.delete(f"tokens/{number}/", what=f"token {number}")
        except ApiError as exc:
            if exc.status == 401:
                raise
            for line in exc.message.splitlines():
                out.note(f"error: {line}")
            code = code or exc.code
            continue
        out.emit(f"token {number} revoked")
    return code
