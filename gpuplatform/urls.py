from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.utils.translation import gettext_lazy as _
from django.views.i18n import JavaScriptCatalog
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from gpuplatform import api_index, views
from portal import views as portal_views
from telemetry.views import prometheus_metrics

admin.site.site_header = _("gpuplatform operations")
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
    path("", portal_views.landing, name="landing"),
    path("accounts/login/", portal_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password/",
        auth_views.PasswordChangeView.as_view(template_name="portal/password_change.html"),
        name="password_change",
    ),
    path(
        "accounts/password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="portal/password_done.html"),
        name="password_change_done",
    ),
    path("i18n/", include("django.conf.urls.i18n")),
    # The pages' scripts' strings (locale/*/LC_MESSAGES/djangojs.po) in the viewer's language.
    path("jsi18n/", JavaScriptCatalog.as_view(domain="djangojs"), name="javascript-catalog"),
    path("portal/", include("portal.urls")),
    path("admin/", admin.site.urls),
    path("dashboard/", include("live.urls")),
    path("api/v1/", include((api_patterns, "api"))),
    # Kubernetes-style probes: liveness never touches the database, readiness does. /healthz
    # is readiness under its older name (make run and load balancers poll it).
    path("livez", views.livez, name="livez"),
    path("readyz", views.readyz, name="readyz"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prometheus_metrics, name="metrics"),
    path("favicon.ico", views.favicon, name="favicon"),
]
