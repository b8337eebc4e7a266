"""Paging and throttling for the API (kept apart from gpuplatform.api: DRF imports these
while its own settings load, so they must not import DRF's views)."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection
from rest_framework import exceptions, pagination, throttling

from tenants.authentication import TokenContext


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
    """Requests per tenant (all its users and tokens together; per user for browser sessions)
    in fixed windows, counted in PostgreSQL so every web process shares the count. Answers
    429 with Retry-After: the seconds left in the window."""

    def allow_request(self, request, view) -> bool:
        key = self.key(request)
        if key is None:
            return True
        limit, seconds = parse_rate(settings.API_THROTTLE_RATE)
        now = time.time()
        window = int(now // seconds)
        self.wait_s = seconds - (now % seconds)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO tenants_requestcount (key, slot, count) VALUES (%s, %s, 1) "
                "ON CONFLICT (key, slot) DO UPDATE "
                "SET count = tenants_requestcount.count + 1 RETURNING count",
                [key, window],
            )
            (count,) = cursor.fetchone()
            if count == 1:  # a new window: forget this key's old ones
                cursor.execute(
                    "DELETE FROM tenants_requestcount WHERE key = %s AND slot < %s",
                    [key, window],
                )
        return count <= limit

    def wait(self) -> float:
        return self.wait_s

    @staticmethod
    def key(request) -> str | None:
        if not (request.user and request.user.is_authenticated):
            return None
        if isinstance(request.auth, TokenContext):
            return f"tenant-{request.auth.tenant.pk}"
        return f"user-{request.user.pk}"


def parse_rate(rate: str) -> tuple[int, int]:
    """'6000/min' -> (6000, 60). Periods: s, min, h, day (DRF's spelling)."""
    count, _, period = rate.partition("/")
    seconds = {
        "s": 1,
        "sec": 1,
        "m": 60,
        "min": 60,
        "h": 3600,
        "hour": 3600,
        "d": 86400,
        "day": 86400,
    }[period]
    return int(count), seconds
