from django.urls import path

from tenants import api

urlpatterns = [
    path("me/", api.MeView.as_view(), name="me"),
    path("tokens/", api.TokenList.as_view(), name="token-list"),
    path("tokens/<int:pk>/", api.TokenRevoke.as_view(), name="token-revoke"),
    path("quota/", api.QuotaView.as_view(), name="quota"),
    path("usage/", api.UsageView.as_view(), name="usage"),
    path("tenant/members/", api.TenantMemberList.as_view(), name="tenant-member-list"),
    path(
        "tenant/members/<str:username>/",
        api.TenantMemberDetail.as_view(),
        name="tenant-member-detail",
    ),
    path("tenant/tokens/", api.TenantTokenList.as_view(), name="tenant-token-list"),
    path("tenant/tokens/<int:pk>/", api.TenantTokenRevoke.as_view(), name="tenant-token-revoke"),
    path("operator/tenants/", api.OperatorTenantList.as_view(), name="operator-tenant-list"),
    path(
        "operator/tenants/<str:name>/",
        api.OperatorTenantDetail.as_view(),
        name="operator-tenant-detail",
    ),
    path(
        "operator/tenants/<str:name>/members/",
        api.OperatorMemberList.as_view(),
        name="operator-member-list",
    ),
    path("operator/quotas/", api.OperatorQuotaList.as_view(), name="operator-quota-list"),
    path(
        "operator/quotas/<int:pk>/", api.OperatorQuotaDetail.as_view(), name="operator-quota-detail"
    ),
]
