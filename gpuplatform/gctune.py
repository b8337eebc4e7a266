"""Python's cyclic garbage collector in long-lived processes, set once they have started.

CPython collects its youngest generation after every 700 net container allocations, and each
collection walks every object that generation holds, however little of it is garbage. A web
process that has loaded Django, DRF and our apps holds a great many such objects for its
whole life; a request that builds many objects (a 1,000-task submission makes a Task, dicts
and strings per task) then triggers dozens of collections that walk the request's live objects
again and again and, once they age, the long-lived ones too.

``settle()``: everything loaded so far goes to the permanent generation (``gc.freeze``, as
Instagram's Django servers do: collections never walk it again), and the youngest generation
is collected after 50,000 allocations instead of 700. Objects freed by reference counting (nearly
all of a request's) never wait for the collector; only reference cycles do, and 50,000 young
objects are a few MB at most.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def settle() -> None:
    """Call once, at the end of a process's start-up (after Django and the apps are loaded)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
