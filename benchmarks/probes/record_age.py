"""How old a collective record is when the viewer's ingest receives it, for the batch spacing of a
world size: render_scale's synthetic ranks (real PUSH sockets, the real protocol; each record's
``start_ns + dur`` is its completion on the wall clock) into a LiveSource polled in this process.

    python benchmarks/probes/record_age.py [RANKS] [SECONDS] [BATCH_MS ...]

Per batch spacing: p50 / p99 / max of (receive time - completion) over every record of the
steady part. This is the part of the end-to-end latency that the rank's batching decides; the
snapshot interval and the paint come on top and do not depend on it (e2e_latency.py measures all
of it, with real ranks). Without BATCH_MS: what a worker of RANKS ranks uses now
(workers.wire.config.batch_ms_for_world).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standing"))

from _tui_probe import spawn_publishers  # noqa: E402 - after the path

from tui.ingest.sources import LiveSource  # noqa: E402
from workers.wire import protocol as p  # noqa: E402
from workers.wire.config import batch_ms_for_world  # noqa: E402
from workers.wire.connection import create_run  # noqa: E402

PER_RANK_S = 370.0  # records per second per rank, as render_scale


def ages_ms(ranks: int, seconds: float, batch_ms: float) -> np.ndarray:
    """Every steady-state record's age at receipt (ms)."""
    conn = create_run(label="record-age")
    source = LiveSource(conn)
    start_at = time.time() + 1.5
    procs = spawn_publishers(str(conn.path), ranks, ranks * PER_RANK_S, seconds, 2, start_at, batch_ms=batch_ms)
    steady_from = start_at + 1.0
    ages: list[np.ndarray] = []
    try:
        while time.time() < start_at + seconds + 0.5:
            for message in source.poll(0.01):
                now = time.time_ns()
                if isinstance(message, p.Batch) and message.kind == p.COLL and now / 1e9 > steady_from:
                    cols = message.columns
                    done = cols["start_ns"] + (cols["dur_us"] * 1000).astype(np.int64)
                    ages.append((now - done) / 1e6)
    finally:
        source.close()
        for proc in procs:
            proc.wait(timeout=30)
    return np.concatenate(ages) if ages else np.zeros(0)


def main() -> int:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    spacings = [float(x) for x in sys.argv[3:]] or [batch_ms_for_world(50.0, ranks)]
    print(f"{ranks} ranks, {PER_RANK_S:g} records/s each, {seconds:g} s; record age at receipt, ms")
    for batch_ms in spacings:
        a = ages_ms(ranks, seconds, batch_ms)
        if not len(a):
            print(f"batches every {batch_ms:g} ms: no records received")
            continue
        p50, p99 = np.percentile(a, [50, 99])
        print(f"batches every {batch_ms:g} ms: n {len(a)}  p50 {p50:.1f}  p99 {p99:.1f}  max {a.max():.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
