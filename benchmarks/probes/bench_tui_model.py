"""How fast the TUI model applies record batches and builds snapshots (target: >= 1e6
records/s applied on one core; a snapshot of 8 ranks well under the 80 ms tick).

    python benchmarks/probes/bench_tui_model.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from frozen_run import frozen_coll  # noqa: E402  (test-only message builder)

from tui.model.run_model import RunModel  # noqa: E402


def apply_rate(world: int, batch: int, total: int = 400_000) -> tuple[float, float]:
    n_batches = max(1, total // batch // world)
    batches = [
        frozen_coll(r, i, range(i * batch, (i + 1) * batch), np.full(batch, 2700.0), world=world)
        for i in range(n_batches)
        for r in range(world)
    ]
    model = RunModel()
    t0 = time.perf_counter()
    for b in batches:
        model.apply(b)
    rate = n_batches * world * batch / (time.perf_counter() - t0)
    # Every rank changed since the last snapshot (the live case): re-apply one batch each.
    spent = 0.0
    for _ in range(10):
        for b in batches[-world:]:
            model.apply(b)
        t0 = time.perf_counter()
        model.snapshot()
        spent += time.perf_counter() - t0
    return rate, spent / 10


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(f"{'ranks':>5} {'batch':>6} {'records/s':>12} {'snapshot ms':>12}")
    for world, batch in ((8, 50), (8, 200), (8, 1000), (64, 200), (512, 200)):
        rate, snap_s = apply_rate(world, batch)
        print(f"{world:>5} {batch:>6} {rate:>12,.0f} {snap_s * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
