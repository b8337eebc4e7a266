"""Read-only inventory endpoints: nodes and GPUs with their state."""

from __future__ import annotations

from rest_framework import generics, serializers

from scheduling import selectors
from scheduling.models import GPU, Node


class NodeOut(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.name")
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = [
            "name",
            "pool",
            "hostname",
            "backend",
            "state",
            "state_reason",
            "last_heartbeat",
            "gpu_count",
        ]


class GpuOut(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")

    class Meta:
        model = GPU
        fields = [
            "uuid",
            "node",
            "index",
            "model",
            "gpu_type",
            "memory_mb",
            "pci_bus_id",
            "state",
            "state_reason",
            "foreign_memory_mb",
            "last_seen_at",
        ]


class NodeList(generics.ListAPIView):
    """Nodes of the cluster with their state and GPU count."""

    serializer_class = NodeOut

    def get_queryset(self):
        return selectors.node_list()


class GpuList(generics.ListAPIView):
    """GPUs of the cluster with their state, type and memory."""

    serializer_class = GpuOut

    def get_queryset(self):
        return selectors.gpu_list()
