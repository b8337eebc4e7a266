"""Paging and throttling for the API (kept apart from gpuplatform.api: DRF imports these
while its own settings load, so they must not import DRF's views)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import pagination, serializers, throttling

from gpuplatform import query
from gpuplatform.query import WholeNumber
from gpuplatform.throttle import PACER, consume, parse_rate, token_key
from tenants.authentication import TokenContext

__all__ = ["Page", "TenantThrottle", "parse_rate"]


class PageQuery(serializers.Serializer):
    limit = WholeNumber(minimum=1, required=False, help_text="rows per page; more than 500 is cut")
    offset = WholeNumber(required=False, help_text="rows to skip")


class Page(pagination.LimitOffsetPagination):
    """``limit`` (1 to 500; more is cut to 500) and ``offset`` (a bigint, as PostgreSQL's
    OFFSET takes). A value that is not such a whole number is a 400 naming the parameter, like
    every other bad parameter (gpuplatform.query), where DRF would quietly use the default."""

    default_limit = 50
    max_limit = 500

    def get_limit(self, request) -> int:
        return min(_paging(request).get("limit", self.default_limit), self.max_limit)

    def get_offset(self, request) -> int:
        return _paging(request).get("offset", 0)

    def get_schema_operation_parameters(self, view):
        return [
            {**param, "schema": {**param["schema"], **_BOUNDS[param["name"]]}}
            for param in super().get_schema_operation_parameters(view)
        ]


_BOUNDS = {
    "limit": {"minimum": 1, "maximum": query.BIGINT_MAX, "format": "int64"},
    "offset": {"minimum": 0, "maximum": query.BIGINT_MAX, "format": "int64"},
}


def _paging(request) -> dict:
    """The request's limit and offset, read once."""
    read = getattr(request, "_paging", None)
    if read is None:
        read = request._paging = query.parse(PageQuery, request.query_params)
    return read


class TenantThrottle(throttling.BaseThrottle):
    """Requests per tenant (all its users and tokens together; per user for browser sessions),
    paced evenly (gpuplatform.throttle) and counted in PostgreSQL so every web process shares
    the pace. Answers 429 with Retry-After. DRF runs throttles after authentication and
    permissions and before the view, so before the body is parsed and before any query of the
    view; requests without a valid token are paced by address where their 401 is answered
    (gpuplatform.api.handle_exception)."""

    wait_s = 0.0

    def allow_request(self, request, view) -> bool:
        key = self.key(request)
        if key is None:
            return True
        rate = settings.API_THROTTLE_RATE
        verdict = consume(key, rate)
        token = request.auth.token if isinstance(request.auth, TokenContext) else None
        if token is not None:
            PACER.authenticated(token.prefix)
        if verdict.allowed:
            return True
        self.wait_s = verdict.wait_s
        if token is not None:
            # From now on this process refuses the token's requests before any work.
            PACER.refused(token_key(token.prefix), verdict, rate)
        return False

    def wait(self) -> float:
        return self.wait_s

    @staticmethod
    def key(request) -> str | None:
        if not (request.user and request.user.is_authenticated):
            return None
        if isinstance(request.auth, TokenContext):
            return f"tenant-{request.auth.tenant.pk}"
        return f"user-{request.user.pk}"
