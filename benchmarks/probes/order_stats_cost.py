"""What an epoch's p50/p90/p99/max of float32 durations cost on this machine's numpy and CPU:
numpy's sort, numpy's partition at the percentile positions, and the histogram placing of
``tui.report.placed`` (what ``commtop report`` uses where it beats the sort), per epoch of
RANKS ranks (each rank's positions and the epoch's).

    python benchmarks/probes/order_stats_cost.py [--sizes 300000,1200000,4800000] [--ranks 8]

A SIMD sort (x86-simd-sort on an AVX-512 Xeon) beat a 7-position partition 4x at 10 M float32
when the report's sort was chosen (2026-12-02); on the 2-core AMD EPYC VM (2026-12-06) the sort
runs at ~37 ns a value, the partition is ~2.7x faster, and the placing ~3x faster again. Prints
the best of ``--repeat`` per size.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import numpy as np

from tui.report.placed import placed
from workers.wire.stats import order_positions

QS = (50, 90, 99)


def _best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def _ways(values: np.ndarray, starts: list[int]) -> dict[str, Callable[[], object]]:
    parts = list(zip(starts[:-1], starts[1:], strict=True))

    def sort() -> None:
        for a, b in parts:
            np.sort(values[a:b])
        np.sort(values)

    def partition() -> None:
        for a, b in parts:
            np.partition(values[a:b], order_positions(b - a, QS))
        np.partition(values, order_positions(len(values), QS))

    return {"sort": sort, "partition": partition, "placed": lambda: placed(values, starts, QS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="300000,1200000,4800000")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"numpy {np.__version__}, {platform.processor() or platform.machine()}, {args.ranks} ranks an epoch")
    rng = np.random.default_rng(0)
    for n in (int(s) for s in args.sizes.split(",")):
        values = rng.lognormal(np.log(2700.0), 0.08, n).astype(np.float32)
        starts = np.linspace(0, n, args.ranks + 1).astype(int).tolist()
        ms = {name: _best_ms(fn, args.repeat) for name, fn in _ways(values, starts).items()}
        cells = "  ".join(f"{name} {t:8.2f} ms ({t * 1e6 / n:5.1f} ns/value)" for name, t in ms.items())
        print(f"n={n:>9,}  {cells}  sort/placed {ms['sort'] / ms['placed']:5.2f}x")


if __name__ == "__main__":
    main()
