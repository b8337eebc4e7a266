"""ASGI entry point served by daphne: HTTP (portal, admin, API) and websockets."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
# Importing this module before the settings marks a web process: settings give it the
# bounded database connection pool (DB_POOL_SIZE), which no forking process may have.
# Django must be set up before anything imports models (the websocket routes do).
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

if "asgi" in settings.GPUPLATFORM_STOCK:
    from django.core.handlers.asgi import ASGIHandler
else:
    # Django's ASGI handler, but each request's middleware and view run in one hop to a thread.
    from gpuplatform.asgi_handler import ASGIHandler

django_asgi_app = ASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from gateway.app import ServicesFirst  # noqa: E402
from gpuplatform.routing import routes  # noqa: E402
from gpuplatform.throttle import EarlyThrottle  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ServicesFirst(EarlyThrottle(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(routes()))),
    }
)

# Start-up is over: what it loaded is never walked by the garbage collector again, and the
# young generation is collected less often (gpuplatform.gctune).
if "gc" not in settings.GPUPLATFORM_STOCK:
    from gpuplatform import gctune

    gctune.settle()
