"""Fresh memory for a one-shot read of a big recording: small pages, not transparent huge pages.

NumPy asks the kernel for transparent huge pages (madvise) for every array of 4 MB or more.
Where the kernel compacts memory on such a fault (``defrag`` = ``madvise``, the common
default), a process that touches a few hundred MB of new arrays once, as ``commtop report``
does, can spend longer in those faults than in its arithmetic: 10 M records took ~1.5 s more
wall time with huge pages than without on a 2-core VM (benchmarks/RESULTS.md, issue 15).
The values computed are the same either way; only where the memory comes from changes.

glibc then hands every block over 32 MB (and, by default, most over 128 KB) out as a fresh
mapping and unmaps it on free, so each temporary column is faulted in page by page again: 293,000
minor faults for 10 M records (0.9 s of system time of 3 s on the VM). Inside the read, big
blocks come from the heap and stay there once freed (``heap_kept``): a page is faulted once,
then reused (213,000 faults, about the peak RSS; 0.2-0.3 s less system time).

The same pass also builds tens of thousands of small objects that live until it ends (a
chunk's unpacked dict, its encodings): each full collection of the cyclic garbage collector
walks all of them again, ~8 % of the report's wall time at 10 M records. Nothing in the read
makes reference cycles worth collecting before the process exits, so the collector waits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys
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


#: glibc's mallopt parameters (malloc.h) and their defaults, put back after the block.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_KEEP = 2**31 - 1  # bytes of free heap kept before any goes back to the system (mallopt takes an int)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc (it has mallopt and malloc_trim); else None. glibc's
    soname first: ``find_library`` runs ``ldconfig -p`` in a subprocess at every call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextmanager
def heap_kept() -> Iterator[None]:
    """glibc: inside the block every allocation comes from the heap (none gets its own mapping)
    and freed heap is kept, so the next big array reuses pages already faulted in. After it,
    glibc's defaults are set again and free heap goes back to the system (``malloc_trim``).
    Elsewhere (musl, macOS) a no-op."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, _KEEP)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
        libc.malloc_trim(0)
