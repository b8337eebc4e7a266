"""Create an API token for a member: ``manage.py issue_token USER TENANT [--name N] [--days D]``."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenants import services
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Create an API token for a member of a tenant and print it (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("tenant")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--days", type=int, help="expire after this many days")

    def handle(self, *args, username, tenant, name, days, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"username: no user {username!r}")
        tenant_obj = Tenant.objects.filter(name=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"tenant: no tenant {tenant!r}")
        if days is not None and days <= 0:
            raise CommandError("--days: must be a positive number of days")
        expires_at = timezone.now() + timedelta(days=days) if days else None
        try:
            token, secret = services.apitoken_create(
                user=user, tenant=tenant_obj, name=name, expires_at=expires_at
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(secret)
