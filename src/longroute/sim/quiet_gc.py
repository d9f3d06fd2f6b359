"""The cyclic garbage collector, kept out of a simulation's way while it runs.

A run allocates a few container objects per event (heap entries, requests, records)
that die young or live to the end, and forms no reference cycles (none left for a
collection after the Mooncake and short-chat cases of ``benchmarks/sim_speed.py``),
so each collection walks objects for nothing. At CPython's default young threshold
(700) a 100K-request run collects ~430 times, two of them full passes over every
object the workload built, for ~7% of its CPU. While :func:`quiet_gc` is active what
existed before the run is frozen (``gc.freeze``: never walked) and a young collection
waits for ``YOUNG_THRESHOLD`` net new objects; both are undone on exit (a process that
had frozen objects before, as ``longroute serve`` does, stays frozen), so the collector
still runs, only rarely. Results do not depend on it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Freeze what exists and raise the young threshold; restore both on exit."""
    threshold = gc.get_threshold()
    was_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    gc.set_threshold(max(threshold[0], YOUNG_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if not was_frozen:
            gc.unfreeze()
