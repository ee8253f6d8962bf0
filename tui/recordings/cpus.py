"""How many threads a one-shot read or sort of a recording may use.

numpy's inflates, sorts and gathers release the GIL, so a report's passes over ten million
records scale with the cores the process may run on (its affinity, as ``taskset`` or a
container's cpuset leave it), not with ``os.cpu_count()``. Capped: past ~8 threads the parts
that hold the GIL (unpacking a chunk, a row's Python) leave nothing to gain, and a report
should not take a whole shared node from the job beside it.
"""

from __future__ import annotations

import os

#: Most threads one pass uses.
MAX_THREADS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def threads_for(limit: int = MAX_THREADS) -> int:
    """Threads for one parallel pass: the usable CPUs, at least 1, at most ``limit``."""
    return max(1, min(limit, MAX_THREADS, usable_cpus()))
