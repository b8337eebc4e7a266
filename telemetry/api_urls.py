from django.urls import path

from telemetry import api

urlpatterns = [
    path("tasks/<int:pk>/metrics/", api.TaskMetrics.as_view(), name="task-metrics"),
    path("gpus/live/", api.GpuLive.as_view(), name="gpu-live"),
    path("usage/sampled/", api.SampledUsage.as_view(), name="usage-sampled"),
    path(
        "operator/tasks/<int:pk>/metrics/",
        api.OperatorTaskMetrics.as_view(),
        name="operator-task-metrics",
    ),
    path("operator/gpus/<int:pk>/metrics/", api.GpuMetrics.as_view(), name="operator-gpu-metrics"),
    path(
        "operator/nodes/<str:name>/metrics/",
        api.NodeMetrics.as_view(),
        name="operator-node-metrics",
    ),
    path("operator/gpus/live/", api.OperatorGpuLive.as_view(), name="operator-gpu-live"),
    path("operator/usage/sampled/", api.OperatorSampledUsage.as_view(), name="operator-usage"),
]
