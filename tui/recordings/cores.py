"""How many threads a one-shot read of a recording may use.

``commtop report`` inflates chunks (zlib releases the GIL), decodes columns and sorts epochs
(numpy releases it): work that spreads over cores. It runs on the node (a 16-core or larger
host) as often as on a 2-core VM, so the thread count follows the cores this process may run
on, capped where more threads stopped paying on the 16-core H200 host (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import os

#: No more threads than this, whatever the core count: the rest of a read holds the GIL.
MAX_THREADS = 8


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def read_threads() -> int:
    """Threads for a recording's read: one per usable core, 2 to MAX_THREADS (1 on one core)."""
    cores = usable_cores()
    return 1 if cores < 2 else min(MAX_THREADS, cores)
