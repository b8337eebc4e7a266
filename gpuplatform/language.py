"""The language a websocket's reader asked for, as Django negotiates a request's: the language
cookie, then Accept-Language, else LANGUAGE_CODE. Pages render in it, and so do the reasons and
texts the sockets push (portal.consumers, live.consumers)."""

from __future__ import annotations

from django.utils import translation


class _Headers:
    """Enough of a request for Django's language negotiation (cookie, then Accept-Language)."""

    def __init__(self, scope) -> None:
        headers = dict(scope.get("headers") or [])
        self.META = {"HTTP_ACCEPT_LANGUAGE": headers.get(b"accept-language", b"").decode()}
        self.COOKIES = scope.get("cookies") or {}
        self.path_info = "/"


def scope_language(scope) -> str:
    """The language of the websocket connection ``scope``."""
    return translation.get_language_from_request(_Headers(scope))
