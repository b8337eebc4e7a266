"""The node agent's interface to the control plane: all it calls, and what it reports through.

A node agent (``nodeagent``) reads and writes only the rows of its own node's work (its node,
GPUs, attempts) and otherwise calls these modules:

- ``messages``: the plain data that crosses processes (assignments, start and exit reports,
  GPU inventory, samples and XID events);
- ``reports``: how an attempt started and ended, fencing (``fences``), lost attempts;
- ``handoff``: a finished task's GPUs handed to the scheduler's listed successors
  (the scheduler's own placement, exported for exactly that).

Nothing here imports the node agent, so this boundary could be served over a network.
Importing this package loads nothing: a supervisor imports ``reports`` only when it reports.
"""
