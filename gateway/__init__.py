"""The service gateway: ``/services/<task id>/`` on the platform's web server, proxied (HTTP and
websockets) to the service's replicas for the members of its tenant (issue 43)."""
