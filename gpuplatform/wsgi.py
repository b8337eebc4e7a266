"""WSGI entry point (for a WSGI server in front of the API; daphne serves ASGI by default)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
# Importing this module before the settings marks a web process: settings give it the
# bounded database connection pool (DB_POOL_SIZE), which no forking process may have.

application = get_wsgi_application()

from django.conf import settings  # noqa: E402

# Start-up is over (gpuplatform.gctune).
if "gc" not in settings.GPUPLATFORM_STOCK:
    from gpuplatform import gctune

    gctune.settle()
