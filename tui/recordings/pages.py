"""Fresh memory for a one-shot read of a big recording: small pages, not transparent huge pages.

NumPy asks the kernel for transparent huge pages (madvise) for every array of 4 MB or more.
Where the kernel compacts memory on such a fault (``defrag`` = ``madvise``, the common
default), a process that touches a few hundred MB of new arrays once, as ``commtop report``
does, can spend longer in those faults than in its arithmetic: 10 M records took ~1.5 s more
wall time with huge pages than without on a 2-core VM (benchmarks/RESULTS.md, issue 15).
The values computed are the same either way; only where the memory comes from changes.

The same pass also builds tens of thousands of small objects that live until it ends (a
chunk's unpacked dict, its encodings): each full collection of the cyclic garbage collector
walks all of them again, ~8 % of the report's wall time at 10 M records. Nothing in the read
makes reference cycles worth collecting before the process exits, so the collector waits.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


def _switch() -> object:
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


@contextmanager
def small_pages() -> Iterator[None]:
    """NumPy's huge-page advice off inside the block (restored after); a no-op where this
    NumPy has no such switch."""
    switch = _switch()
    if not callable(switch):
        yield
        return
    before = switch(False)
    try:
        yield
    finally:
        switch(before)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block (on again after, if it was on):
    reference counting still frees everything that is not in a cycle."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
