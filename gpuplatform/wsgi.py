"""WSGI entry point (for a WSGI server in front of the API; daphne serves ASGI by default)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")

application = get_wsgi_application()
