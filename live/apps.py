from django.apps import AppConfig


class LiveConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "live"
    verbose_name = "live dashboard"

    def ready(self) -> None:
        # The domain publishes its changes (gpuplatform.events); the live pages hear of them
        # through these, each sent to the websocket groups once the change commits.
        from gpuplatform import events
        from live import events as live

        for topic in events.TOPICS:
            events.subscribe(topic, getattr(live, f"publish_{topic}"))
