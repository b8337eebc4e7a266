from django.urls import path

from live import views

app_name = "live"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("history/", views.history_series, name="history"),
    path(
        "<str:kind>/<int:pk>/<str:action>/",
        views.act,
        name="act",
    ),
]
