"""First-run setup for ``make run``: the operator account, a demo tenant and its token.

Idempotent: a second run changes nothing and prints no secret. Secrets are printed once, on
the run that creates them, and stored only hashed. The background schedules are not made
here: ``migrate`` creates them (``scheduling.passes.backstops_ensure``).
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from scheduling import quotas
from tenants import services
from tenants.models import Quota, Role, Tenant


class Command(BaseCommand):
    help = "Create the operator account and a demo tenant with its admin and API token."

    def add_arguments(self, parser):
        parser.add_argument("--no-demo", action="store_true", help="skip the demo tenant")

    @transaction.atomic
    def handle(self, *args, no_demo: bool, **options):
        lines = []
        User = get_user_model()
        if not User.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "", password)
            lines.append(f"  operator  admin / {password}   (Django admin: /admin/)")
        if not no_demo and not Tenant.objects.filter(name="demo").exists():
            tenant = services.tenant_create(name="demo", display_name="Demo lab")
            quotas.quota_set(quota=Quota(tenant=tenant, max_gpus=4, max_priority=90))
            password = secrets.token_urlsafe(12)
            user = User.objects.create_user("alice", "", password)
            # The demo lab's only person: its admin (quota, members and tokens are admins').
            services.membership_change(user=user, tenant=tenant, role=Role.ADMIN)
            _, token = services.apitoken_create(user=user, tenant=tenant, name="demo")
            lines.append(f"  admin     alice / {password}   (tenant demo, role admin)")
            lines.append(f"  API token {token}")
        if lines:
            self.stdout.write(
                self.style.WARNING(
                    "First run: these credentials are shown once and stored only hashed. Keep them."
                )
            )
            for line in lines:
                self.stdout.write(line)
