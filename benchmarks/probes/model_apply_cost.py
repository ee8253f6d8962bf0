"""RunModel.apply + one snapshot per round of 64 rank batches, per batch (min of 3 repeats): the
ingest thread's cost per collective batch, e.g. before and after a model change (run it in a tree
of each, alternating, on one machine).

    python benchmarks/probes/model_apply_cost.py [RECORDS_PER_BATCH]
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from job_synth import T0, job_hello  # noqa: E402

from tui.model.run_model import RunModel  # noqa: E402
from workers.wire import protocol as p  # noqa: E402

RANKS, ROUNDS = 64, 40


def batch(rank: int, k: int, n: int) -> p.Batch:
    it = np.arange(k * n, (k + 1) * n, dtype=np.int64)
    cols = {
        "iteration": it,
        "step": it // 4,
        "epoch": np.zeros(n, np.int32),
        "mode": np.zeros(n, np.uint8),
        "op": np.zeros(n, np.uint8),
        "group": np.zeros(n, np.uint16),
        "dtype": np.ones(n, np.uint8),
        "nbytes": np.full(n, 4096, np.int64),
        "host_ns": T0 + it * 1000,
        "start_ns": T0 + it * 1000,
        "dur_us": np.random.default_rng(rank).random(n).astype(np.float32) * 100,
        "algbw": np.ones(n, np.float32),
        "busbw": np.ones(n, np.float32),
    }
    return p.Batch(p.COLL, rank, k, 0, cols, t_ns=T0)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    batches = [[batch(r, k, n) for r in range(RANKS)] for k in range(ROUNDS)]
    best = []
    for _ in range(3):
        model = RunModel(clock=lambda: T0)
        for r in range(RANKS):
            model.apply(job_hello(r, RANKS, T0), T0)
        model.snapshot()
        t = time.perf_counter()
        for k in range(ROUNDS):
            for b in batches[k]:
                model.apply(b, T0)
            model.snapshot()
        best.append((time.perf_counter() - t) / (ROUNDS * RANKS) * 1e6)
    print(f"{platform.node()} ({os.cpu_count()} cpus): {min(best):.1f} us per batch of {n} records, min of 3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
