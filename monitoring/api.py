"""Alerts under /api/v1/: a tenant's alerts about its tasks, and every alert for operators."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers

from gpuplatform import query
from gpuplatform.api import IsOperator, IsTenantMember, request_tenant
from monitoring import selectors
from monitoring.models import Alert


class AlertOut(serializers.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid", allow_null=True, default=None)
    gpu_index = serializers.IntegerField(source="gpu.index", allow_null=True, default=None)
    node = serializers.SerializerMethodField()
    task = serializers.IntegerField(source="task_id", allow_null=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "kind",
            "severity",
            "message",
            "gpu",
            "gpu_index",
            "node",
            "task",
            "opened_at",
            "last_seen_at",
            "resolved_at",
        ]

    def get_node(self, alert: Alert) -> str | None:
        node = alert.node or (alert.gpu.node if alert.gpu else None)
        return node.name if node else None


class AlertQuery(serializers.Serializer):
    open = serializers.BooleanField(
        default=False, help_text="only alerts still open (open=1, true or yes)"
    )


def _open_only(request) -> bool:
    return query.parse(AlertQuery, request.query_params)["open"]


class AlertList(generics.ListAPIView):
    """Alerts about your tenant's tasks (an idle GPU you hold, an XID that stopped a task),
    newest first."""

    permission_classes = [IsTenantMember]
    serializer_class = AlertOut

    @extend_schema(parameters=[AlertQuery])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Alert.objects.none()
        tenant = request_tenant(self.request).tenant
        return selectors.alert_list(tenant=tenant, open_only=_open_only(self.request))


class OperatorAlertList(generics.ListAPIView):
    """Every alert, newest first (operators)."""

    permission_classes = [IsOperator]
    serializer_class = AlertOut

    @extend_schema(parameters=[AlertQuery])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        return selectors.alert_list_all(open_only=_open_only(self.request))
