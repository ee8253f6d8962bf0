"""What the collector's data feed (tui.ingest.feed, for `commtop ab --run`) costs per forwarded
message: FeedPublisher.forward of a real signed batch (1000 collective records), with no
subscriber (the usual case) and with one reading it. Prints the machine and µs per message,
next to the cost of decoding the same message (what the collector does anyway), as a ratio.

    python benchmarks/feed_cost.py [--n 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from tui.ingest.feed import FeedPublisher
from workers.wire import connection, protocol
from workers.wire.protocol import COLL, COLL_COLUMNS, Batch, batch_body


def frames(conn: connection.Connection) -> list[bytes]:
    n = 1000
    cols = {name: np.zeros(n, dtype=dt) for name, dt in COLL_COLUMNS.items()}
    cols["start_ns"][:] = time.time_ns() + np.arange(n) * 1000
    return protocol.seal(conn.key, batch_body(COLL, conn.session, Batch(COLL, 0, 0, 0, cols)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ns = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ct-feed-", dir="/tmp")
    os.environ[connection.RUNTIME_DIR_ENV] = root
    try:
        conn = connection.create_run(label="feed")
        msg = frames(conn)
        t0 = time.perf_counter()
        for _ in range(2000):
            protocol.decode(protocol.open_frames(conn.key, msg, conn.session))
        decode_us = (time.perf_counter() - t0) / 2000 * 1e6
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
            for _ in range(ns.n):
                pub.forward(msg)
            results[label] = (time.perf_counter() - t0) / ns.n * 1e6
            if reader is not None:
                reader.terminate()
                reader.wait()
        pub.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"feed cost · {platform.node()} · {os.cpu_count()} cores · a batch of 1000 records ({len(msg[1])} bytes)")
    print(f"  decode (what the collector does anyway): {decode_us:.1f} µs per message")
    for label, us in results.items():
        print(f"  forward, {label}: {us:.2f} µs per message = {us / decode_us:.3f} x decode (target < 0.1 x)")


if __name__ == "__main__":
    main()
