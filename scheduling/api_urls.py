from django.urls import path

from scheduling import api, controls

urlpatterns = [
    path("tasks/", api.TaskList.as_view(), name="task-list"),
    path("tasks/<int:pk>/", api.TaskDetailView.as_view(), name="task-detail"),
    path("tasks/<int:pk>/events/", api.TaskEvents.as_view(), name="task-events"),
    path("tasks/<int:pk>/log/", api.TaskLog.as_view(), name="task-log"),
    *(
        path(
            f"tasks/<int:pk>/{action}/",
            api.TaskControl.as_view(action=action),
            name=f"task-{action}",
        )
        for action in controls.TENANT_ACTIONS
    ),
    path("nodes/", api.NodeList.as_view(), name="node-list"),
    path("gpus/", api.GpuList.as_view(), name="gpu-list"),
    path("pools/", api.PoolList.as_view(), name="pool-list"),
    path("operator/tasks/", api.OperatorTaskList.as_view(), name="operator-task-list"),
    *(
        path(
            f"operator/gpus/<int:pk>/{action}/",
            api.GpuDrain.as_view(action=action),
            name=f"operator-gpu-{action}",
        )
        for action in ("drain", "undrain")
    ),
    *(
        path(
            f"operator/nodes/<str:name>/{action}/",
            api.NodeDrain.as_view(action=action),
            name=f"operator-node-{action}",
        )
        for action in ("drain", "undrain")
    ),
]
