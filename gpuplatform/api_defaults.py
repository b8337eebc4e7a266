"""Paging and throttling for the API (kept apart from gpuplatform.api: DRF imports these
while its own settings load, so they must not import DRF's views)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import pagination, throttling

from tenants.authentication import TokenContext


class Page(pagination.LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class TenantThrottle(throttling.SimpleRateThrottle):
    """Requests per tenant (all its users and tokens together), shared by every web process
    through the database cache. Answers 429 with Retry-After."""

    scope = "tenant"

    def get_rate(self) -> str:
        return settings.API_THROTTLE_RATE

    def get_cache_key(self, request, view) -> str | None:
        if not (request.user and request.user.is_authenticated):
            return None
        if isinstance(request.auth, TokenContext):
            return f"throttle-tenant-{request.auth.tenant.pk}"
        return f"throttle-user-{request.user.pk}"
