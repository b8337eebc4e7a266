from django.urls import path

from portal import views

app_name = "portal"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("tenant/", views.switch_tenant, name="switch_tenant"),
    path("tasks/", views.task_list, name="tasks"),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    path("tasks/<int:pk>/log/", views.task_log, name="task_log"),
    path("tasks/<int:pk>/parts/", views.task_parts, name="task_parts"),
    path("tasks/<int:pk>/<str:action>/", views.task_control, name="task_control"),
    path("submit/", views.submit, name="submit"),
    path("submit/preview/", views.submit_preview, name="submit_preview"),
    path("spec/", views.spec_reference, name="spec"),
    path("usage/", views.usage, name="usage"),
    path("usage.csv", views.usage_csv, name="usage_csv"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token_revoke"),
    path("team/", views.team, name="team"),
    path("team/<str:username>/remove/", views.member_remove, name="member_remove"),
]
