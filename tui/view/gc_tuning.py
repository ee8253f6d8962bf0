"""The live view's garbage-collector settings: fewer, shorter collections.

Why: Textual allocates a few thousand short-lived objects a frame (strips, segments, messages),
so CPython's default threshold (700 allocations) runs a young collection ~20 times a second,
and every tenth of those cascades into older generations; the occasional full collection then
walks the ~55,000 objects the app made at start-up (modules, styles, widgets), which never die.
Measured at 8 ranks and 15 frames/s on the 2-core VM (benchmarks/render_scale.py with GC
callbacks): 2.05 % of a core in the collector before, 0.55 % after (issue 15).

What is kept: every cycle is still collected, later; objects alive at start-up are frozen
(``gc.freeze``), so a cycle among them that dies later is never collected: start-up objects
that die (a dialog's first widgets) cost their memory once, not a leak that grows.
"""

from __future__ import annotations

import gc

#: Allocations between young collections (CPython's default is 700).
YOUNG_THRESHOLD = 5000


def settle_garbage_collector() -> None:
    """Collect once, freeze what is alive, and raise the young generation's threshold. Call it
    once, from the process that shows the live view, after the app is mounted."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
