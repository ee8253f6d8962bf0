"""A synthetic GPU-like run for the recordings benchmark (benchmarks/standing/recordings.py): an
all_gather every ~2.7 ms per rank, in 50 ms batches, as real protocol.Batch objects."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.wire import protocol as p  # noqa: E402
from workers.wire.busbw import algbw_gbps  # noqa: E402

T0 = 1_764_600_000_000_000_000


def batches(records: int, ranks: int, seed: int = 0):
    """(recv_ns, Batch) for about ``records`` collective records, vectorised per batch."""
    rng = np.random.default_rng(seed)
    nbytes = 128 * 1024 * 1024 * ranks
    clock = np.full(ranks, T0, dtype=np.int64)
    it = np.zeros(ranks, dtype=np.int64)
    seq = 0
    made = 0
    t = T0
    while made < records:
        t += 50_000_000
        for r in range(ranks):
            mode = (t - T0) // 60_000_000_000 % 4  # a new mode every minute
            dur = rng.lognormal(np.log(2700.0 * (1 + mode)), 0.08, 40).astype(np.float32)
            gaps = (dur.astype(np.int64) * 1000) + rng.integers(2_000, 30_000, 40)
            starts = clock[r] + np.concatenate([[0], np.cumsum(gaps)[:-1]])
            n = int(np.searchsorted(starts, t))
            if n == 0:
                continue
            starts, dur = starts[:n], dur[:n]
            iters = it[r] + np.arange(n)
            alg = algbw_gbps(nbytes, dur).astype(np.float32)
            cols = {
                "iteration": iters,
                "step": iters // 32,
                "epoch": np.full(n, mode, dtype=np.int32),
                "mode": np.full(n, mode, dtype=np.uint8),
                "op": np.zeros(n, dtype=np.uint8),
                "group": np.zeros(n, dtype="<u2"),
                "dtype": np.zeros(n, dtype="u1"),
                "nbytes": np.full(n, nbytes, dtype=np.int64),
                "host_ns": starts - rng.integers(5_000, 40_000, n),
                "start_ns": starts,
                "dur_us": dur,
                "algbw": alg,
                "busbw": (alg * np.float32((ranks - 1) / ranks)).astype(np.float32),
            }
            clock[r] = starts[-1] + gaps[n - 1]
            it[r] += n
            made += n
            yield t + 200_000 + r * 1000, p.Batch(p.COLL, r, seq, 0, cols, t_ns=t)
        seq += 1
