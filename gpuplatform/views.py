"""Health endpoints, and the error pages that are not the API's own."""

from __future__ import annotations

import json
import logging
import sys
from http import HTTPStatus

from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views import defaults

from gpuplatform.outage import DATABASE_RETRY_AFTER_S, DATABASE_UNAVAILABLE, database_unavailable

logger = logging.getLogger(__name__)


def livez(request: HttpRequest) -> JsonResponse:
    """Liveness: the web process answers. Never touches the database, so an outage of the
    database does not get healthy web processes restarted."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the process answers and reaches the database; 503 while it cannot."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        logger.warning("readiness: database unreachable: %s", exc)
        response = JsonResponse(
            {"status": "unavailable", "detail": DATABASE_UNAVAILABLE,
             "checks": {"database": "unreachable"}},
            status=503,
        )  # fmt: skip
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        return response
    return JsonResponse({"status": "ok", "detail": "ready", "checks": {"database": "ok"}})


def healthz(request: HttpRequest) -> JsonResponse:
    """Readiness under its older name, plus how each node separates tenants: a node whose
    agent is not root says "single-user mode: tenants are not isolated on this host"."""
    response = readyz(request)
    if response.status_code != HTTPStatus.OK:
        return response
    from scheduling.agentapi.messages import SINGLE_USER_NOTE
    from scheduling.models import Node

    isolation = dict(Node.objects.order_by("name").values_list("name", "isolation"))
    body = json.loads(response.content)
    body["isolation"] = isolation
    body["warnings"] = [
        f"node {name}: {SINGLE_USER_NOTE}"
        for name, how in isolation.items()
        if how == SINGLE_USER_NOTE
    ]
    return JsonResponse(body)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The API answers unknown paths in its own error shape; the rest gets Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "not found", "errors": {}}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django calls this inside its ``except`` block, so the exception is at hand: an
    unreachable database answers 503 with Retry-After (JSON under /api/, plain text
    elsewhere); anything else is Django's plain 500 page."""
    if not database_unavailable(sys.exc_info()[1]):
        if request.path.startswith("/api/"):
            return JsonResponse({"detail": "internal server error", "errors": {}}, status=500)
        return defaults.server_error(request)
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            {"detail": DATABASE_UNAVAILABLE, "errors": {}}, status=503
        )
    else:
        response = HttpResponse(
            "503 Service Unavailable: the database is unreachable; retry later.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


class QuietDatabaseOutage(logging.Filter):
    """Log an unreachable database as one line, not a traceback per request: during an outage
    every request fails the same way, and the pool already logs each failed connection."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and database_unavailable(record.exc_info[1]):
            cause = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(cause).__name__}: {cause})"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """``/favicon.ico``, which browsers and bookmarks ask for whatever a page links: the
    platform's icon (static/favicon.svg), where the pages' ``<link rel="icon">`` points."""
    return HttpResponseRedirect(static("favicon.svg"))
