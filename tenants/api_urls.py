from django.urls import path

from tenants import api

urlpatterns = [
    path("me/", api.MeView.as_view(), name="me"),
]
