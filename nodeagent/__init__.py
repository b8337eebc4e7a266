"""The node agent: the program that runs on every GPU host.

It registers the host's GPUs, heartbeats, samples telemetry, and launches and supervises the
tasks the control plane (``scheduling``) routes to it. It talks to the control plane only
through ``scheduling.agentapi``: the services it calls and the rows it owns and reports through.
"""
