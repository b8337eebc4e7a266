from django.urls import re_path

from portal.consumers import TaskLogConsumer

websocket_urlpatterns = [
    re_path(r"^ws/portal/tasks/(?P<pk>[0-9]{1,18})/log/$", TaskLogConsumer.as_asgi()),
]
