"""``/metrics`` for Prometheus, guarded by a bearer token or by the scraper's address."""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from telemetry import metrics


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    try:
        # REMOTE_ADDR is the client's own, or the one a trusted proxy vouched for
        # (gpuplatform.middleware.TrustedProxyMiddleware).
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(
        client in ipaddress.ip_network(net, strict=False)
        for net in settings.METRICS_ALLOWED_ADDRESSES
    )


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse(
            "metrics: present 'Authorization: Bearer <METRICS_TOKEN>' or scrape from an "
            "address in METRICS_ALLOWED_ADDRESSES\n",
            status=401 if settings.METRICS_TOKEN else 403,
            content_type="text/plain",
        )
        if settings.METRICS_TOKEN:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(metrics.registry()), content_type=CONTENT_TYPE_LATEST)
