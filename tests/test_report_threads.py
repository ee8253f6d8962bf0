"""The report's parallel passes size themselves from the CPUs the process may use (its affinity)."""

from __future__ import annotations

import os
import threading

from tui.recordings.cpus import MAX_THREADS, threads_for, usable_cpus


def test_threads_follow_the_affinity_not_the_machine() -> None:
    """Pinned to one CPU (as taskset or a cpuset would pin it), a pass gets one thread. Linux
    applies sched_setaffinity(0) to the calling thread, so a thread of its own is pinned."""
    seen: list[tuple[int, int]] = []

    def pinned() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen.append((usable_cpus(), threads_for()))

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert seen == [(1, 1)]


def test_threads_are_capped() -> None:
    assert usable_cpus() == len(os.sched_getaffinity(0))
    assert threads_for() == min(MAX_THREADS, usable_cpus())
    assert threads_for(1) == 1
    assert 1 <= threads_for(3) <= 3
