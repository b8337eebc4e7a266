from django.urls import path

from monitoring import api

urlpatterns = [
    path("alerts/", api.AlertList.as_view(), name="alert-list"),
    path("operator/alerts/", api.OperatorAlertList.as_view(), name="operator-alert-list"),
]
