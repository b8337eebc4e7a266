"""Running tasks on their node: a detached supervisor per attempt, and the services around it.

The django-q2 task that launches (routed to the node's own cluster) only starts a supervisor
and returns. The supervisor runs the command, enforces timeout/cancel/pause, records the exit
status, and survives restarts of every other platform process.
"""
