"""The trace simulator: replays a workload against the pure policy core on a simulated clock."""
