"""numpy's sort against a partition at the report's percentile positions, on this machine's
numpy and CPU: which gives a rank's and an epoch's p50/p90/p99/max of float32 durations faster.

    python benchmarks/probes/sort_vs_partition.py [--sizes 300000,1200000,4800000]

A SIMD sort (x86-simd-sort on an AVX-512 Xeon) beat a 7-position partition 4x at 10 M float32
when the report's sort was chosen (2026-12-02); on the 2-core AMD EPYC VM the sort runs at
~37 ns a value and the partition is ~2.7x faster. Prints the best of ``--repeat`` per size.
"""

from __future__ import annotations

import argparse
import functools
import platform
import time

import numpy as np

from workers.wire.stats import order_positions

QS = (50, 90, 99)


def _best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="300000,1200000,4800000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"numpy {np.__version__}, {platform.processor() or platform.machine()}")
    rng = np.random.default_rng(0)
    for n in (int(s) for s in args.sizes.split(",")):
        values = rng.lognormal(np.log(2700.0), 0.08, n).astype(np.float32)
        kth = order_positions(n, QS)
        sort_ms = _best_ms(functools.partial(np.sort, values), args.repeat)
        part_ms = _best_ms(functools.partial(np.partition, values, kth), args.repeat)
        print(
            f"n={n:>9,}  sort {sort_ms:8.2f} ms ({sort_ms * 1e6 / n:5.1f} ns/value)  "
            f"partition at {len(kth)} positions {part_ms:8.2f} ms  sort/partition {sort_ms / part_ms:5.2f}x"
        )


if __name__ == "__main__":
    main()
