"""Idempotency keys: a request sent again with the same ``Idempotency-Key`` gets the first
answer instead of doing the work twice. Keys belong to one tenant.

The pair runs inside the caller's transaction: ``idempotency_claim`` before the work,
``idempotency_record`` after it, so the key commits with what the request did, or not at all
(a refused request does not use up its key)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from scheduling.models import IdempotencyKey
from tenants.models import Tenant


class KeyReused(ValueError):
    """The key was used before for a request with another body."""


@dataclass(frozen=True)
class Earlier:
    """The first request's answer, to send again."""

    status: int
    response: Any


def idempotency_claim(*, tenant: Tenant, key: str, body: bytes) -> Earlier | None:
    """Claim ``key`` for this request. None: the key is new and now ours, and the caller does
    the work, then calls ``idempotency_record`` in the same transaction. Otherwise the first
    request's answer; a request still running with the key is waited for (the unique index
    holds our insert until it commits or rolls back). Raises KeyReused for another body."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("idempotency_claim runs in the transaction that does the work")
    fingerprint = hashlib.sha256(body).hexdigest()
    try:
        with transaction.atomic():
            IdempotencyKey.objects.create(tenant=tenant, key=key, fingerprint=fingerprint)
        return None
    except IntegrityError:
        pass
    earlier = IdempotencyKey.objects.select_for_update().get(tenant=tenant, key=key)
    if earlier.fingerprint != fingerprint:
        raise KeyReused("already used for a different request")
    return Earlier(status=earlier.status or 201, response=earlier.response)


def idempotency_record(*, tenant: Tenant, key: str, status: int, response: Any) -> None:
    """Store the answer of the request that claimed ``key``, for its retries."""
    IdempotencyKey.objects.filter(tenant=tenant, key=key).update(status=status, response=response)
