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
def tenant_create(
    *,
    name: str,
    display_name: str = "",
    description: str = "",
    is_active: bool = True,
    unix_user: str = "",
) -> Tenant:
    """A new tenant, checked by the model's rules (ValidationError naming the field)."""
    tenant = Tenant(
        name=name,
        display_name=display_name,
        description=description,
        is_active=is_active,
        unix_user=unix_user,
    )
    tenant.full_clean()
    tenant.save()
    return tenant


def _membership_set(*, user: AbstractBaseUser, tenant: Tenant, role: str) -> Membership:
    # Without the last-admin rule: callers go through membership_change.
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": Role(role)}
    )
    return membership


@transaction.atomic
def apitoken_create(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    name: str,
    expires_at: datetime | None = None,
    parent: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for a member of the tenant. Returns the row and the secret, shown once.

    A token made with another token (``parent``) can neither outlive nor outrank it: same user
    and tenant, an expiry no later than the parent's (the parent's when none is asked for), and
    authentication refuses it once the parent is revoked or expired."""
    if not Membership.objects.filter(user=user, tenant=tenant).exists():
        raise ValueError(f"{user} is not a member of tenant {tenant}")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("expires_at: must be in the future")
    if parent is not None:
        if (parent.user_id, parent.tenant_id) != (user.pk, tenant.pk):
            raise ValueError("parent: a token can only make tokens for its own user and tenant")
        if parent.expires_at is not None:
            if expires_at is not None and expires_at > parent.expires_at:
                raise ValueError(
                    f"expires_at: must not be later than the parent token's expiry "
                    f"({parent.expires_at.isoformat()})"
                )
            expires_at = expires_at or parent.expires_at
    secret, prefix = tokens.generate()
    token = ApiToken.objects.create(
        user=user,
        tenant=tenant,
        name=name,
        prefix=prefix,
        key_hash=tokens.hash_token(secret),
        expires_at=expires_at,
        parent=parent,
    )
    return token, secret


def apitokens_revoke(*, tokens: QuerySet[ApiToken]) -> int:
    """Revoke at once; revoking twice keeps the first revocation time. Returns how many."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


class LastAdmin(ValueError):
    """The change would leave the tenant without an admin."""


def _keeps_an_admin(*, tenant: Tenant, losing: AbstractBaseUser) -> None:
    # The tenant's row lock serialises membership changes: two admins demoting each other at
    # once cannot both pass.
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    others = Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exclude(user=losing)
    if not others.exists():
        raise LastAdmin(f"tenant {tenant} needs an admin: make another member admin first")


@transaction.atomic
def membership_change(*, tenant: Tenant, user: AbstractBaseUser, role: str) -> Membership:
    """Add ``user`` to the tenant with ``role``, or change its role, for a tenant admin or an
    operator (API, portal, admin alike); the last admin stays (LastAdmin)."""
    current = Membership.objects.filter(tenant=tenant, user=user).first()
    if current is not None and current.role == Role.ADMIN and role != Role.ADMIN:
        _keeps_an_admin(tenant=tenant, losing=user)
    return _membership_set(user=user, tenant=tenant, role=role)


@transaction.atomic
def membership_remove(*, membership: Membership) -> None:
    """Remove a member; its tokens in the tenant are revoked (so a later re-add does not bring
    them back). The last admin cannot be removed."""
    if membership.role == Role.ADMIN:
        _keeps_an_admin(tenant=membership.tenant, losing=membership.user)
    apitokens_revoke(tokens=ApiToken.objects.filter(tenant=membership.tenant, user=membership.user))
    membership.delete()
