from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "tenant portal"
