"""Python's cyclic garbage collector in long-lived web processes, set once they have started.

CPython collects its youngest generation after every 700 net container allocations, and each
collection walks every object that generation holds, however little of it is garbage. A
request that builds many objects (a 1,000-task submission) so triggers many collections that
walk its live objects again and again and, once they age, what Django and the apps loaded too.

``settle()`` moves everything loaded so far to the permanent generation (``gc.freeze``, as
Instagram's Django servers do: collections never walk it again) and collects the youngest
generation after 50,000 allocations instead of 700. Objects freed by reference counting
(nearly all of a request's) never wait for the collector; only reference cycles do.
``GPUPLATFORM_STOCK=gc`` keeps the interpreter's defaults instead.
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
