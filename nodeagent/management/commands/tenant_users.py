"""List the Unix users the platform made for tenants on this node, and remove those of tenants
that no longer exist: ``python manage.py tenant_users [--remove-orphans [--yes]]``."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from nodeagent.launcher import identity, tenant_users
from scheduling.agentapi.tenants import known_tenants


class Command(BaseCommand):
    help = (
        "List the Unix users the platform made for tenants on this host (GECOS 'gpuplatform "
        "tenant <name>', named TENANT_USER_PREFIX + tenant); --remove-orphans removes those of "
        "tenants that no longer exist (a dry run unless --yes). Other users are never touched."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--prefix",
            default=settings.TENANT_USER_PREFIX,
            help="the user names' prefix (default: TENANT_USER_PREFIX)",
        )
        parser.add_argument(
            "--remove-orphans",
            action="store_true",
            help="remove the users of tenants that no longer exist (dry run without --yes)",
        )
        parser.add_argument("--yes", action="store_true", help="really remove them")

    def handle(self, *args, prefix, remove_orphans, yes, **options):
        if yes and not remove_orphans:
            raise CommandError("--yes: only with --remove-orphans")
        users = tenant_users.made_users(prefix)
        known = known_tenants()
        orphans = tenant_users.orphans(users, known.names, known.unix_users)
        for user in users:
            state = "orphan" if user in orphans else "in use"
            self.stdout.write(f"{user.name}\tuid {user.uid}\ttenant {user.tenant}\t{state}\t"
                              f"home {user.home}")  # fmt: skip
        self.stdout.write(f"{len(users)} tenant users with prefix {prefix!r}, "
                          f"{len(orphans)} of tenants that no longer exist")  # fmt: skip
        if not remove_orphans or not orphans:
            return
        if not yes:
            self.stdout.write("dry run: --yes removes " + ", ".join(u.name for u in orphans))
            return
        if not identity.privileged():
            raise CommandError("removing Unix users needs root")
        failed = []
        for user in orphans:
            problem = tenant_users.remove(user)
            if problem is None:
                self.stdout.write(f"removed {user.name} (its home {user.home} is left)")
            else:
                failed.append(f"{user.name}: {problem}")
        if failed:
            raise CommandError("not removed: " + "; ".join(failed))
