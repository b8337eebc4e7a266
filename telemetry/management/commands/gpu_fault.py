"""Inject a fault into a simulated GPU: ``manage.py gpu_fault NODE INDEX xid 79``."""

from django.core.management.base import BaseCommand, CommandError

from scheduling.models import GPU
from telemetry import services
from telemetry.models import FaultKind


class Command(BaseCommand):
    help = (
        "Make a simulated GPU report a temperature, an XID or being lost (or clear the "
        "temperature and lost faults); its node agent applies it at its next sample."
    )

    def add_arguments(self, parser):
        parser.add_argument("node", help="node name")
        parser.add_argument("index", type=int, help="GPU index on the node")
        parser.add_argument("kind", choices=FaultKind.values)
        parser.add_argument("value", nargs="?", type=int, help="degrees C, or the XID number")

    def handle(self, *args, node, index, kind, value, **options):
        gpu = GPU.objects.filter(node__name=node, index=index).select_related("node").first()
        if gpu is None:
            raise CommandError(f"no GPU {index} on node {node!r}")
        if gpu.node.backend != "simulated":
            raise CommandError(f"node {node} runs real GPUs ({gpu.node.backend}): nothing to fake")
        try:
            fault = services.fault_inject(gpu=gpu, kind=kind, value=value)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"queued: {fault} (applied at the node agent's next sample)")
