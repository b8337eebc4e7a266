"""Run the node agent for this host: ``python manage.py node_agent [--node NAME]``."""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from nodeagent.agent import AgentError, NodeAgent, resolve_node_name
from nodeagent.inventory import BackendUnavailable
from scheduling import nodelink
from scheduling.config import ConfigError, load_config


class Command(BaseCommand):
    help = "Register this node and its GPUs, then heartbeat until stopped (SIGTERM / Ctrl-C)."

    def add_arguments(self, parser):
        parser.add_argument("--node", default=settings.NODE_NAME, help="node name (NODE_NAME)")
        parser.add_argument(
            "--backend",
            choices=["auto", "nvml", "simulated"],
            default=settings.GPU_BACKEND,
            help="where GPUs come from (GPU_BACKEND); auto simulates when there is no driver",
        )
        parser.add_argument(
            "--config", default=str(settings.GPUPLATFORM_CONFIG), help="estate YAML file"
        )
        parser.add_argument(
            "--once", action="store_true", help="register once and exit (no heartbeat loop)"
        )
        parser.add_argument(
            "--no-launcher",
            action="store_true",
            help="launch nothing here (no spawner, no job thread, no report relay)",
        )

    def handle(self, *args, node, backend, config, once, no_launcher, **options):
        try:
            if settings.NODE_ADVERTISE_ADDRESS:
                nodelink.parse_address(settings.NODE_ADVERTISE_ADDRESS)
            estate = load_config(config)
            agent = NodeAgent(
                config=estate, node_name=resolve_node_name(estate, node), backend_kind=backend
            )
        except (ConfigError, AgentError, BackendUnavailable, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        if once:
            gpus = agent.register()
            self.stdout.write(
                f"node {agent.name}: registered {len(gpus)} GPU(s) via {agent.backend.name}"
            )
            for gpu in gpus:
                self.stdout.write(
                    f"  gpu{gpu.index} {gpu.uuid} {gpu.model} {gpu.memory_mb} MiB "
                    f"{gpu.gpu_type} {gpu.pci_bus_id}"
                )
            agent.backend.close()
            return
        try:
            agent.run(launcher=not no_launcher)
        except AgentError as exc:
            raise CommandError(str(exc)) from exc
