"""Writes for tenants, memberships and API tokens."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from tenants import tokens
from tenants.models import ApiToken, Membership, Role, Tenant


@transaction.atomic
def tenant_create(*, name: str, display_name: str = "", description: str = "") -> Tenant:
    tenant = Tenant(name=name, display_name=display_name, description=description)
    tenant.full_clean()
    tenant.save()
    return tenant


@transaction.atomic
def membership_set(*, user: AbstractBaseUser, tenant: Tenant, role: str) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": Role(role)}
    )
    return membership


@transaction.atomic
def apitoken_create(
    *, user: AbstractBaseUser, tenant: Tenant, name: str, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create a token for a member of the tenant. Returns the row and the secret, shown once."""
    if not Membership.objects.filter(user=user, tenant=tenant).exists():
        raise ValueError(f"{user} is not a member of tenant {tenant}")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("expires_at: must be in the future")
    secret, prefix = tokens.generate()
    token = ApiToken.objects.create(
        user=user,
        tenant=tenant,
        name=name,
        prefix=prefix,
        key_hash=tokens.hash_token(secret),
        expires_at=expires_at,
    )
    return token, secret


def apitokens_revoke(*, tokens: QuerySet[ApiToken]) -> int:
    """Revoke at once; revoking twice keeps the first revocation time. Returns how many."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
