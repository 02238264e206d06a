"""The garbage collector, set for a long-running server once start-up is over.

With CPython's default (a young collection every 700 net new container objects) almost
every request here ran one, and each promoted the objects of the requests in flight, so
full collections, which walk every object the imports made, came several times a second:
about 13 % of a request's CPU in the benchmark. What start-up made (modules, settings,
routes, pools) lives as long as the process, so it is frozen out of the collector's sight,
and young collections come less often. Cyclic garbage is still collected, in fewer and
larger passes: a request must make none (docs/architecture.md, tests/e2e/test_garbage.py),
or the garbage of thousands of them waits for one pass that stalls every request.

A config reload retires a whole generation (router, pools, handlers) that start-up made:
frozen, its reference cycles would never be collected, so once it is closed the heap is
thawed, collected and frozen again.
"""

from __future__ import annotations

import gc

_frozen = False  # set once start-up froze the heap: only then is there anything to thaw


def settle_after_startup(young_threshold: int) -> None:
    """Freeze what start-up made and space young collections `young_threshold` apart
    (0: leave the interpreter's collector as it is)."""
    global _frozen
    if young_threshold <= 0:
        return
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    gc.collect()
    gc.freeze()
    _frozen = True


def settle_after_retire() -> None:
    """After a retired config generation closed: collect what it left in cycles (one full
    collection), and freeze what is still alive again."""
    if not _frozen:
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
