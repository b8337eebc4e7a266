"""Request middleware of our own."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from gpuplatform.throttle import client_address, trusted_proxy

FORWARDING_HEADERS = (
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_FORWARDED_HOST",
    "HTTP_X_FORWARDED_PORT",
    "HTTP_FORWARDED",
)


class TrustedProxyMiddleware:
    """Believe X-Forwarded-For/-Proto only from TRUSTED_PROXIES. From a trusted proxy,
    REMOTE_ADDR becomes the client's address (throttling by address uses it) and
    X-Forwarded-Proto stays for SECURE_PROXY_SSL_HEADER; from anyone else the forwarding
    headers are dropped. Must come first: SecurityMiddleware's HTTPS redirect reads them."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        self.rewrite(request.META)
        return self.get_response(request)

    @staticmethod
    def rewrite(meta: dict) -> None:
        peer = meta.get("REMOTE_ADDR", "")
        if trusted_proxy(peer):
            meta["REMOTE_ADDR"] = client_address(peer, meta.get("HTTP_X_FORWARDED_FOR"))
            return
        for header in FORWARDING_HEADERS:
            meta.pop(header, None)
