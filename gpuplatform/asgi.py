"""ASGI entry point served by daphne: HTTP (portal, admin, API) and websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
# Importing this module before the settings marks a web process: settings give it the
# bounded database connection pool (DB_POOL_SIZE), which no forking process may have.
# Django must be set up before anything imports models (the websocket routes do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from gpuplatform.routing import routes  # noqa: E402
from gpuplatform.throttle import EarlyThrottle  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": EarlyThrottle(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(routes()))),
    }
)
