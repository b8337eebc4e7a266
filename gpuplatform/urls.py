from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from gpuplatform import api_index, views
from telemetry.views import prometheus_metrics

admin.site.site_header = "gpuplatform operations"
admin.site.site_title = "gpuplatform"

api_patterns = [
    path("", api_index.ApiIndex.as_view(), name="index"),
    path("", include("tenants.api_urls")),
    path("", include("scheduling.api_urls")),
    path("", include("telemetry.api_urls")),
    path("", include("monitoring.api_urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
]

handler404 = "gpuplatform.views.not_found"
handler500 = "gpuplatform.views.server_error"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False)),
    path("admin/", admin.site.urls),
    path("dashboard/", include("live.urls")),
    path("api/v1/", include((api_patterns, "api"))),
    # Kubernetes-style probes: liveness never touches the database, readiness does. /healthz
    # is readiness under its older name (make run and load balancers poll it).
    path("livez", views.livez, name="livez"),
    path("readyz", views.readyz, name="readyz"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prometheus_metrics, name="metrics"),
]
