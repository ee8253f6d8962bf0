"""What the collector's data feed (tui.ingest.feed, for `commtop ab --run`) costs per forwarded
message: FeedPublisher.forward of a real signed batch (1000 collective records), with no
subscriber (the usual case) and with one reading it. Prints the machine and µs per message,
next to the cost of decoding the same message (what the collector does anyway), as a ratio.

    python benchmarks/standing/feed_cost.py [--n 20000] [--tiny]

Same-run reference: decoding the same message (what the collector does with it anyway).
Target: forwarding costs < 0.1 x that reference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

from tui.ingest.feed import FeedPublisher
from workers.wire import connection, protocol
from workers.wire.protocol import COLL, COLL_COLUMNS, Batch, batch_body


def frames(conn: connection.Connection) -> list[bytes]:
    n = 1000
    cols = {name: np.zeros(n, dtype=dt) for name, dt in COLL_COLUMNS.items()}
    cols["start_ns"][:] = time.time_ns() + np.arange(n) * 1000
    return protocol.seal(conn.key, batch_body(COLL, conn.session, Batch(COLL, 0, 0, 0, cols)))


TARGET = 0.1  # forward / decode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--n", type=int, default=0, help="messages forwarded per case (default 20,000; tiny 500)")
    ns = ap.parse_args(argv)
    n = ns.n or (500 if ns.tiny else 20_000)
    decodes = 200 if ns.tiny else 2000
    root = tempfile.mkdtemp(prefix="ct-feed-", dir="/tmp")
    os.environ[connection.RUNTIME_DIR_ENV] = root
    try:
        conn = connection.create_run(label="feed")
        msg = frames(conn)
        t0 = time.perf_counter()
        for _ in range(decodes):
            protocol.decode(protocol.open_frames(conn.key, msg, conn.session))
        decode_us = (time.perf_counter() - t0) / decodes * 1e6
        pub = FeedPublisher(conn)
        results = {}
        for label in ("no subscriber", "one subscriber"):
            reader = None
            if label == "one subscriber":  # another process, as `commtop ab --run` is
                code = (
                    "import sys, time; from workers.wire import connection; from tui.ingest.feed import FeedSource; "
                    "s = FeedSource(connection.load(sys.argv[1])); end = time.monotonic() + float(sys.argv[2]); "
                    "n = sum(len(s.poll(0.05)) for _ in iter(lambda: time.monotonic() > end, True)); print(n)"
                )
                reader = subprocess.Popen(
                    [sys.executable, "-c", code, conn.path, "30"], stdout=subprocess.PIPE, text=True
                )
                time.sleep(2.0)  # let it start and subscribe
            t0 = time.perf_counter()
            for _ in range(n):
                pub.forward(msg)
            results[label] = (time.perf_counter() - t0) / n * 1e6
            if reader is not None:
                reader.terminate()
                reader.wait()
        pub.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = Report(f"data feed: forwarding a batch of 1000 records ({len(msg[1]):,} bytes) to `commtop ab --run`")
    t = report.table(
        f"µs per message ({n:,} forwarded per case); reference: decoding the same message, same run",
        ("case", "µs per message", "x reference", "target", "met"),
    )
    t.add("decode (reference: what the collector does anyway)", decode_us, 1.0, "", "")
    for label, us in results.items():
        t.add(f"forward, {label}", us, us / decode_us, f"< {TARGET:g} x", us / decode_us < TARGET)
    report.notes.append("the subscriber is another process, as `commtop ab --run` is")
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
