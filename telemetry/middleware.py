"""Counts API requests for ``gpuplatform_api_requests_total`` (by method and status)."""

from __future__ import annotations

from telemetry.metrics import API_REQUESTS


def count_api_requests(get_response):
    def middleware(request):
        response = get_response(request)
        if request.path.startswith("/api/"):
            API_REQUESTS.labels(request.method, str(response.status_code)).inc()
        return response

    return middleware
