"""How compact recordings are and how fast they read back (targets: <= 16 bytes per collective
record on disk, >= 5 million records/s read, a report over 10 million records in seconds).

    /work/venv/bin/python benchmarks/recording_speed.py [--records 10000000] [--ranks 8]

Writes a synthetic GPU-like run (all_gather every ~2.7 ms per rank, 50 ms batches, one chunk
per flush interval of the live Recorder) with the real writer, then times the
columnar read and `commtop report` on it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui.recording import Recorder, RecordingWriter, open_recording  # noqa: E402
from workers import protocol as p  # noqa: E402
from workers.busbw import algbw_gbps  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--keep", default="", help="write the recording here and keep it")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(ns.keep or os.path.join(d, "bench.commtop"))
        t = time.perf_counter()
        writer = RecordingWriter(open(path, "wb"), {"schema_version": p.SCHEMA_VERSION})
        chunk: list = []
        every_ns = Recorder().flush_s * 1e9  # one chunk as often as the live Recorder writes one
        for item in batches(ns.records, ns.ranks):
            if chunk and item[0] - chunk[0][0] >= every_ns:
                writer.write_chunk(chunk)
                chunk = []
            chunk.append(item)
        writer.write_chunk(chunk)
        writer.close({"complete": True})
        write_s = time.perf_counter() - t
        size = path.stat().st_size
        rec = open_recording(path)
        n = rec.records
        print(f"records            {n:,} in {len(rec.chunks):,} chunks ({ns.ranks} ranks)")
        print(f"file               {size / 1e6:,.1f} MB = {size / n:.2f} bytes/record (target <= 16)")
        print(f"write (gen+encode) {write_s:.1f} s = {n / write_s / 1e6:.2f} M records/s")
        for label, cols in (
            ("read all columns", None),
            ("read report columns", ("epoch", "mode", "op", "nbytes", "start_ns", "dur_us", "algbw", "busbw")),
        ):
            t = time.perf_counter()
            tables = open_recording(path).tables(coll_columns=cols)
            dt = time.perf_counter() - t
            assert len(tables.coll["dur_us"]) == n
            print(f"{label:18} {dt:.2f} s = {n / dt / 1e6:.2f} M records/s (target >= 5)")
            del tables
        try:
            from tui import report
        except ImportError:
            return 0
        t = time.perf_counter()
        with open(os.devnull, "w") as null:
            old, sys.stdout = sys.stdout, null
            try:
                rc = report.main([str(path), "--format", "json"])
            finally:
                sys.stdout = old
        print(f"commtop report     {time.perf_counter() - t:.2f} s (exit {rc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
