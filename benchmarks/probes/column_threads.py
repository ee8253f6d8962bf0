"""How the reader's column decode scales with threads on this machine: ``tables(report
columns)`` of one recording with the stored columns decoded on 1 (the serial path), 2, 4, 8
threads (``tui.recordings.bulk.MAX_COLUMN_THREADS``), rounds in rotating order, wall seconds of
``_columns`` and of the whole read. Issue 28: on a 16-core host the decode on 4 threads took
about what it takes on one; is it the threads or the memory?

    python benchmarks/probes/column_threads.py FILE [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from tui.recordings import bulk
from tui.recordings.reader import open_recording
from tui.report.kernels import _group
from tui.report.reading import report_columns

SETTINGS = (1, 2, 4, 8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs ({bulk.usable_cpus()} usable),")
    print(f"python {platform.python_version()}, numpy {np.__version__}")
    columns_s: dict[int, list[float]] = collections.defaultdict(list)
    tables_s: dict[int, list[float]] = collections.defaultdict(list)
    real_columns, real_parallel = bulk._columns, bulk.PARALLEL_RECORDS
    walls: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_columns(*args, **kwargs)
        finally:
            walls.append(time.perf_counter() - t)

    bulk._columns = timed  # type: ignore[assignment]
    for r in range(ns.rounds):
        for threads in SETTINGS[r % len(SETTINGS) :] + SETTINGS[: r % len(SETTINGS)]:
            bulk.PARALLEL_RECORDS = 1 << 62 if threads == 1 else real_parallel
            bulk.MAX_COLUMN_THREADS = threads
            bulk.usable_cpus = lambda threads=threads: max(threads, 2)  # type: ignore[assignment]
            walls.clear()
            with open_recording(ns.file) as rec:
                t = time.perf_counter()
                rec.tables(coll_columns=report_columns(rec), group_by=_group)
                tables_s[threads].append(time.perf_counter() - t)
            columns_s[threads].append(sum(walls))
    print("threads | _columns s, median (all) | tables s, median (all)")
    for threads in SETTINGS:
        c, t = columns_s[threads], tables_s[threads]
        print(
            f"{threads} | {statistics.median(c):.3f} ({' '.join(f'{x:.3f}' for x in c)}) | "
            f"{statistics.median(t):.3f} ({' '.join(f'{x:.3f}' for x in t)})"
        )


if __name__ == "__main__":
    main()
