"""Paging and throttling for the API (kept apart from gpuplatform.api: DRF imports these
while its own settings load, so they must not import DRF's views)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import exceptions, pagination, throttling

from gpuplatform.throttle import PACER, consume, parse_rate, token_key
from tenants.authentication import TokenContext

__all__ = ["Page", "TenantThrottle", "parse_rate"]


class Page(pagination.LimitOffsetPagination):
    """``limit`` (1 to 500; more is cut to 500) and ``offset``. A value that is not a whole
    number is a 400 naming the parameter, like every other bad parameter, where DRF would
    quietly use the default."""

    default_limit = 50
    max_limit = 500

    def get_limit(self, request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        limit = _whole_number(self.limit_query_param, raw, minimum=1)
        return min(limit, self.max_limit)

    def get_offset(self, request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return _whole_number(self.offset_query_param, raw, minimum=0)


def _whole_number(param: str, raw: str, *, minimum: int) -> int:
    # isdigit() alone lets "²" through, which int() refuses.
    if not (raw.isascii() and raw.isdigit()) or int(raw) < minimum:
        what = "a positive whole number" if minimum else "a whole number, 0 or more"
        raise exceptions.ValidationError({param: [f"must be {what}, got {raw!r}"]})
    return int(raw)


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
