from django.apps import AppConfig


class NodeAgentConfig(AppConfig):
    name = "nodeagent"
    verbose_name = "node agent"
