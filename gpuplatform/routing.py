"""Websocket routes. Live GPU charts and task updates register their consumers here."""

websocket_urlpatterns: list = []
