from django.urls import path

from scheduling import api

urlpatterns = [
    path("nodes/", api.NodeList.as_view(), name="node-list"),
    path("gpus/", api.GpuList.as_view(), name="gpu-list"),
]
