"""GET /api/v1/: what the API offers, for someone who just opened the URL `make run` printed.

Anyone may read it (it names resources, never data); every resource it lists still asks for a
token or a session."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

# (name in the index, URL name under api:, what it is). Collections only: their items are
# <collection><id>/ and listed in the schema.
RESOURCES = [
    ("me", "me", "the caller: user, operator flag, the token's tenant, memberships"),
    ("tasks", "task-list", "your tenant's tasks (GET, with filters); submit tasks (POST)"),
    ("gpus", "gpu-list", "GPUs: state, memory reserved and free, which of your tasks use each"),
    ("nodes", "node-list", "nodes: pool, state, heartbeat, GPU count"),
    ("pools", "pool-list", "pools with their node and GPU counts"),
    ("quota", "quota", "your tenant's limits, what it uses now, its fair-share standing"),
    ("usage", "usage", "GPU-hours per day"),
    ("usage/sampled", "usage-sampled", "GPU-hours held, used and idle per day and member"),
    ("gpus/live", "gpu-live", "every GPU's newest sample: load, memory, temperature, holder"),
    ("alerts", "alert-list", "alerts about your tenant's tasks (idle GPUs, XIDs)"),
    ("tokens", "token-list", "your API tokens in this tenant; create and revoke them"),
    ("operator/tasks", "operator-task-list", "every tenant's tasks (operators only)"),
    ("operator/tenants", "operator-tenant-list", "tenants and their members (operators only)"),
    ("operator/quotas", "operator-quota-list", "quotas (operators only)"),
    ("operator/alerts", "operator-alert-list", "every alert (operators only)"),
]
AUTHENTICATION = (
    "Authorization: Bearer <token> (from `gpuctl token create`, the first `make run`, or "
    "`python manage.py issue_token USER TENANT`), or the admin session with its CSRF token"
)

ResourceOut = inline_serializer(
    "ApiResource", {"url": serializers.URLField(), "description": serializers.CharField()}
)
IndexOut = inline_serializer(
    "ApiIndex",
    {
        "name": serializers.CharField(),
        "version": serializers.CharField(),
        "authentication": serializers.CharField(),
        "schema": serializers.URLField(help_text="The OpenAPI schema."),
        "docs": serializers.URLField(help_text="Swagger UI for the schema."),
        "resources": serializers.DictField(
            child=ResourceOut, help_text="Resource name -> its URL and what it is."
        ),
    },
)


class ApiIndex(APIView):
    """The API's resources and where its schema and docs are. No authentication needed."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses=IndexOut, auth=[{}])
    def get(self, request: Request) -> Response:
        def url(name: str) -> str:
            return request.build_absolute_uri(reverse(f"api:{name}"))

        return Response(
            {
                "name": "gpuplatform API",
                "version": "v1",
                "authentication": AUTHENTICATION,
                "schema": url("schema"),
                "docs": url("docs"),
                "resources": {
                    name: {"url": url(url_name), "description": description}
                    for name, url_name, description in RESOURCES
                },
            }
        )
