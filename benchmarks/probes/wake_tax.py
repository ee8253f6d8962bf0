"""What a thread pays for waking up: the same small numpy steps timed warm (back to back) and
right after a sleep as long as a snapshot interval, as the TUI's ingest and UI threads run them.

    python benchmarks/probes/wake_tax.py [SLEEP_S] [ROUNDS]       (default 1/15 s, 60 rounds)

Prints the median time of each step, warm and after the sleep, then the same step run again
at once after the sleep. VM (2 cores), 2026-12-05: each step as the first after a 67 ms sleep
took 6-38x its warm time (a 2 us np.concatenate of three 74-value arrays ~55 us, a 54 us
percentile ~330 us), and about its warm time run again at once. A snapshot's cost on an idling
machine is then mostly how many different steps it takes, not how much data they touch: the
reason the screen's snapshots between two text ticks take only a few
(tui.model.snapshot_builder.SnapshotBuilder._between_ticks).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np


def _steps() -> list[tuple[str, Callable[[], object]]]:
    a = np.arange(74, dtype=np.int64)
    b = np.arange(74, dtype=np.float32)
    matrix = np.zeros((64, 1024), dtype=np.float32)
    rows = np.zeros(74, dtype=np.intp)
    return [
        ("concatenate", lambda: np.concatenate([a, a, a])),
        ("mod + astype", lambda: (a % 1024).astype(np.intp)),
        ("scatter into 64x1024", lambda: matrix.__setitem__((rows, a % 1024), b)),
        ("cumsum", lambda: np.cumsum(a)),
        ("sort", lambda: np.sort(b)),
        ("isnan.any over 64x1024", lambda: np.isnan(matrix).any(axis=0)),
        ("median", lambda: np.median(b)),
        ("percentile 50, 99", lambda: np.percentile(b, [50, 99])),
        ("python sum of 74 ints", lambda: sum(int(x) for x in range(74))),
    ]


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def main() -> None:
    sleep_s = float(sys.argv[1]) if len(sys.argv) > 1 else 1 / 15
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    steps = _steps()
    warm: list[list[int]] = [[] for _ in steps]
    woken: list[list[int]] = [[] for _ in steps]
    again: list[list[int]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, (_, step) in enumerate(steps):
            t = time.perf_counter_ns()
            step()
            warm[i].append(time.perf_counter_ns() - t)
    for _ in range(rounds):
        for i, (_, step) in enumerate(steps):
            time.sleep(sleep_s)
            t = time.perf_counter_ns()
            step()
            woken[i].append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            step()
            again[i].append(time.perf_counter_ns() - t)
    print(
        f"machine: {platform.node()} · {platform.processor() or platform.machine()} · python {platform.python_version()}"
    )
    print(f"median of {rounds} rounds; 'woken': the step is the first after a {sleep_s * 1e3:.0f} ms sleep\n")
    print(f"{'step':26s} {'warm us':>9s} {'woken us':>9s} {'x warm':>7s} {'again us':>9s}")
    for i, (name, _) in enumerate(steps):
        w, k, g = _median_us(warm[i]), _median_us(woken[i]), _median_us(again[i])
        print(f"{name:26s} {w:9.1f} {k:9.1f} {k / w:7.1f} {g:9.1f}")


if __name__ == "__main__":
    main()
