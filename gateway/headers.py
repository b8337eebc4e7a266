"""Headers across the gateway: what a service is told and what it is never shown.

The client's own ``X-Gpuplatform-*`` headers are dropped and the platform's set instead, so a
service may trust ``X-Gpuplatform-User`` and ``X-Gpuplatform-Tenant``. The platform's
credentials (the ``Authorization: Bearer`` token, the session cookie) never reach a service:
any member of the tenant may run code there. A service may not set the platform's cookies.
"""

from __future__ import annotations

from django.conf import settings

from gateway.upstream import Route

# Hop-by-hop headers (RFC 9110 7.6.1) and those the gateway sets itself.
HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"proxy-connection",
}  # fmt: skip
OURS = b"x-gpuplatform-"
FORWARDED = {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-forwarded-prefix"}
# Websocket handshake headers, which the websocket client writes itself.
HANDSHAKE = {
    b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
    b"sec-websocket-protocol", b"sec-websocket-accept", b"host", b"origin",
}  # fmt: skip


def _without_session(cookie: bytes) -> bytes:
    kept = [
        part
        for part in cookie.split(b";")
        if part.strip().partition(b"=")[0].decode("latin-1") != settings.SESSION_COOKIE_NAME
    ]
    return b";".join(kept).strip()


def upstream_request(scope: dict, route: Route, *, websocket: bool = False) -> list[tuple]:
    """The headers a service receives for ``scope``: the client's, less hop-by-hop headers,
    the platform's credentials and anything claiming to be the platform's; plus who called
    and how the request reached the platform (``X-Forwarded-*``, with the prefix kept in the
    path and named in ``X-Forwarded-Prefix``)."""
    headers = []
    forwarded_for = ""
    host = ""
    for name, value in scope.get("headers") or []:
        name = name.lower()
        if name == b"host":
            host = value.decode("latin-1")
        if name == b"x-forwarded-for":
            forwarded_for = value.decode("latin-1")
        if name in HOP or name in FORWARDED or name.startswith(OURS) or name == b"authorization":
            continue
        if websocket and name in HANDSHAKE:
            continue
        if name == b"cookie":
            value = _without_session(value)
            if not value:
                continue
        headers.append((name.decode("latin-1"), value.decode("latin-1")))
    client = (scope.get("client") or ("",))[0]
    chain = f"{forwarded_for}, {client}" if forwarded_for and client else forwarded_for or client
    scheme = {"wss": "https", "ws": "http"}.get(scope.get("scheme", ""), scope.get("scheme"))
    headers += [
        ("x-forwarded-for", chain),
        ("x-forwarded-proto", scheme or "http"),
        ("x-forwarded-host", host),
        ("x-forwarded-prefix", route.prefix),
        ("x-gpuplatform-user", route.username),
        ("x-gpuplatform-tenant", route.tenant_name),
    ]
    return [(name, value) for name, value in headers if value]


def downstream_response(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The service's response headers for the client: hop-by-hop headers dropped, and any
    cookie of the platform's own (session, CSRF) that the service tried to set."""
    platform = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    kept = []
    for name, value in raw:
        name = name.lower()
        if name in HOP:
            continue
        if name == b"set-cookie" and _cookie_name(value) in platform:
            continue
        kept.append((name, value))
    return kept


def _cookie_name(value: bytes) -> str:
    return value.partition(b"=")[0].strip().decode("latin-1")
