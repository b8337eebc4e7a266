"""``manage.py node_credential create|rotate|revoke NODE``: a node agent's own database role."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError
from django.core.validators import ValidationError
from django.db import connection, transaction

from scheduling import nodecredentials
from tenants.models import SLUG_VALIDATOR


class Command(BaseCommand):
    help = (
        "Create, rotate or revoke the PostgreSQL role a node's agent connects as; it may touch "
        "only that node's rows. create and rotate print the DATABASE_URL for the node's agent "
        "(or write it to --output, mode 0600)."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["create", "rotate", "revoke"])
        parser.add_argument("node", help="the node's name, as its agent's NODE_NAME")
        parser.add_argument("--output", help="write the URL to this file (0600), not stdout")
        parser.add_argument("--host", help="the database server's address as the node sees it")
        parser.add_argument("--port", help="the database server's port as the node sees it")
        parser.add_argument("--role", help="the role's name (default gpup_node_<node>)")

    def handle(self, *args, action: str, node: str, **options):
        try:
            SLUG_VALIDATOR(node)
        except ValidationError as exc:
            raise CommandError(f"node: {' '.join(exc.messages)}") from exc
        try:
            if action == "revoke":
                revoked = nodecredentials.node_credential_revoke(node_name=node)
                if revoked is None:
                    self.stdout.write(f"node {node}: no credential")
                    return
                self.stdout.write(f"node {node}: role {revoked.role} dropped")
                if revoked.sessions_ended is None:
                    self.stderr.write(
                        f"its open sessions go on until they end (stop the node's agent): this "
                        f"role may not end them (GRANT pg_signal_backend TO "
                        f"{connection.settings_dict['USER']}, as a superuser, lets it)"
                    )
                return
            with transaction.atomic():  # no new password unless its URL can be given
                issued = nodecredentials.node_credential_issue(
                    node_name=node, role=options["role"], rotate_only=action == "rotate"
                )
                url = nodecredentials.database_url(
                    issued, host=options["host"], port=options["port"]
                )
        except nodecredentials.CredentialError as exc:
            raise CommandError(str(exc)) from exc
        what = "new password for" if issued.rotated else "created"
        if options["output"]:
            _write_private(options["output"], url + "\n")
            self.stderr.write(f"node {node}: {what} role {issued.role}; URL in {options['output']}")
        else:
            self.stderr.write(f"node {node}: {what} role {issued.role}; its DATABASE_URL:")
            self.stdout.write(url)


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, whatever the umask or the file's
    mode before."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise CommandError(f"--output: cannot write {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)
        out.write(text)
