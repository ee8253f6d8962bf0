"""Recordings: bytes per collective record on disk (target <= 16) and `commtop report` read speed
(target >= 10 million records/s, issue 28; issue 15 asked 5) on a generated 10-million-record recording.

    python benchmarks/standing/recordings.py [--records 10000000] [--ranks 8]

The synthetic GPU-like run comes from ``_synth_recording.py`` (its ``batches`` generator: an
all_gather every ~2.7 ms per rank in 50 ms batches, a new mode every minute); it is written
with the real ``RecordingWriter`` in chunks as the live Recorder writes them, then read
back with the columnar reader and with ``commtop report --format json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]
from _synth_recording import batches

from tui import cli as commtop_cli
from tui.recordings.reader import open_recording
from tui.recordings.recorder import Recorder
from tui.recordings.writer import RecordingWriter
from tui.report import command as _report_command  # noqa: F401 - imported before the timing, as it was
from workers.wire import protocol as p

BYTES_TARGET = 16.0
READ_TARGET = 10e6  # issue 28
REPORT_COLUMNS = ("epoch", "mode", "op", "nbytes", "start_ns", "dur_us", "algbw", "busbw")


def write(path: Path, records: int, ranks: int) -> float:
    t = time.perf_counter()
    with open(path, "wb") as f:
        writer = RecordingWriter(f, {"schema_version": p.SCHEMA_VERSION})
        chunk: list = []
        live = Recorder()
        every_ns = live.flush_s * 1e9  # chunks as the live Recorder writes them: by age or by count
        waiting = 0
        for item in batches(records, ranks):
            if chunk and (item[0] - chunk[0][0] >= every_ns or waiting >= live.chunk_records):
                writer.write_chunk(chunk)
                chunk, waiting = [], 0
            chunk.append(item)
            waiting += len(item[1]) if isinstance(item[1], p.Batch) else 1
        writer.write_chunk(chunk)
        writer.close({"complete": True})
    return time.perf_counter() - t


def reference_s(path: Path, n: int) -> float:
    """A fixed workload of the same kind as a report, timed in the same run: inflate the file's
    bytes once (zlib, as the reader does) and sort ``n`` random float32 (as exact percentiles
    do). A slower or busier machine slows both."""
    import zlib

    import numpy as np

    data = zlib.compress(path.read_bytes()[: 64 * 1024 * 1024], 1)
    values = np.random.default_rng(0).lognormal(8, 0.2, n).astype(np.float32)
    t = time.perf_counter()
    zlib.decompress(data)
    np.sort(values)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--records", type=int, default=0, help="collective records (default 10,000,000; tiny 200,000)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument(
        "--reuse", default="", help="read this recording (written by an earlier run) instead of writing one"
    )
    ns = ap.parse_args(argv)
    records = ns.records or (200_000 if ns.tiny else 10_000_000)
    report = Report(f"recordings: {records:,} collective records of {ns.ranks} ranks")
    table = report.table(
        "size on disk and read speed",
        ("measure", "value", "target", "met"),
    )
    with tempfile.TemporaryDirectory() as d:
        path = Path(ns.reuse) if ns.reuse else Path(d) / "bench.commtop"
        write_s = write(path, records, ns.ranks) if not ns.reuse else float("nan")
        size = path.stat().st_size
        rec = open_recording(path)
        n = rec.records
        per = size / n
        table.add("records written", n, "", "")
        table.add("bytes per collective record", per, f"<= {BYTES_TARGET:g}", per <= BYTES_TARGET)
        table.add("write: generate + encode, M records/s", n / write_s / 1e6, "", "")
        for label, cols in (("read all columns", None), ("read report columns", REPORT_COLUMNS)):
            t = time.perf_counter()
            tables = open_recording(path).tables(coll_columns=cols)
            dt = time.perf_counter() - t
            if len(tables.coll["dur_us"]) != n:
                raise SystemExit(f"recordings: read back {len(tables.coll['dur_us'])} records, wrote {n}")
            del tables
            table.add(f"{label}, M records/s", n / dt / 1e6, "", "")
        t = time.perf_counter()
        with open(os.devnull, "w") as null:
            old, sys.stdout = sys.stdout, null
            try:
                rc = commtop_cli.main(["report", str(path), "--format", "json"])
            finally:
                sys.stdout = old
        dt = time.perf_counter() - t
        table.add("`commtop report --format json`, s", dt, "", "")
        table.add(
            "`commtop report` read speed, M records/s", n / dt / 1e6, f">= {READ_TARGET / 1e6:g}", n / dt >= READ_TARGET
        )
        ref_s = reference_s(path, n)
        table.add("same-run reference (zlib-inflate the file + sort n float32), s", ref_s, "", "")
        table.add("`commtop report` / reference", dt / ref_s, "", "")
        if rc != 0:
            report.notes.append(f"commtop report exited with {rc}")
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
