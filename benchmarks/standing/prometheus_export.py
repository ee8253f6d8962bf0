"""What `--prometheus` costs: the rank's loop thread per record, the node sampler's CPU at 8
ranks, and the scrape time of an 8-rank endpoint.

    python benchmarks/standing/prometheus_export.py [--tiny] [--seconds 10] [--rate 15000]

1. Worker side, in this process: the real RecordPublisher publishing real batches (750 records,
   one 50 ms batch of 66 µs collectives) with and without the tap, single calls 2 ms apart,
   alternating; the reference is the same publish() without the tap, in the same run.
2. Node side: the real node sampler (``python -m workers.telemetry``) in its own process, once
   with ``--prometheus 127.0.0.1:0`` and once without (the reference), fed by 8 ranks' real
   publishers at ``--rate`` records/s each (batches every 50 ms, the 4 offload modes in turn);
   its CPU time is read with psutil. Counts on the endpoint are checked against records sent.
3. Scrape: HTTP GETs of that 8-rank endpoint, against a scrape of the same exporter before any
   rank had sent (process metrics only) as the reference.

Targets: every record a rank sends is counted on the endpoint, the tap drops none, and a rank
process imports neither prometheus_client nor the exporter (its only extra work is one NOBLOCK
enqueue per batch; that cost has no numeric target and is reported as a ratio to publish()).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _common import ROOT, Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

RANKS = 8
BATCH = 750  # records in a 50 ms batch of 66 µs collectives (the H200 all_gather, README)


def coll_columns(n: int, mode: int, start: int) -> dict:
    import numpy as np

    it = np.arange(start, start + n)
    return {
        "iteration": it,
        "step": it // 32,
        "epoch": np.zeros(n),
        "mode": np.full(n, mode),
        "op": np.zeros(n),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.full(n, 1 << 27),
        "host_ns": it + time.time_ns(),
        "start_ns": it + time.time_ns(),
        "dur_us": np.random.default_rng(start).lognormal(4.2, 0.3, n),
        "algbw": np.full(n, 1800.0),
        "busbw": np.full(n, 1575.0),
    }


def worker_side(conn, calls: int) -> tuple[float, float, int]:
    """Median ns per publish() without and with the tap, and the records dropped."""
    import zmq

    from workers.export.tap import tap_endpoint
    from workers.rank.publisher import RecordPublisher
    from workers.wire.protocol import COLL

    ctx = zmq.Context()
    sinks = []
    for endpoint in (conn.data, tap_endpoint(conn.session, "bench-worker")):
        sink = ctx.socket(zmq.PULL)
        sink.bind(endpoint)
        sinks.append(sink)
    plain = RecordPublisher(conn.data, conn.key, conn.session, 0, ctx=ctx, hwm=100000)
    tapped = RecordPublisher(
        conn.data, conn.key, conn.session, 1, ctx=ctx, hwm=100000, tap=tap_endpoint(conn.session, "bench-worker")
    )
    for pub in (plain, tapped):
        pub.wait_connected(2.0)
    cols = coll_columns(BATCH, 1, 0)
    times: dict[str, list[float]] = {"plain": [], "tapped": []}
    pair = [("plain", plain), ("tapped", tapped)]
    for i in range(calls):
        # the loop publishes a batch every 50 ms: time single calls a few ms apart, alternating
        # which publisher goes first, never back to back (that would time the zmq I/O thread)
        for name, pub in pair if i % 2 else pair[::-1]:
            t0 = time.perf_counter_ns()
            pub.publish(COLL, cols, BATCH, (0, -1, -1))
            times[name].append(time.perf_counter_ns() - t0)
            time.sleep(0.002)
        if i % 10 == 9:
            for sink in sinks:
                while sink.poll(0):
                    sink.recv_multipart()
    dropped = tapped.tap_dropped + tapped.dropped
    for pub in (plain, tapped):
        pub.close()
    for sink in sinks:
        sink.close(0)
    ctx.term()
    return statistics.median(times["plain"]), statistics.median(times["tapped"]), dropped


def start_sampler(conn_path: str, env: dict, prometheus: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "workers.telemetry"] + (["--prometheus", prometheus] if prometheus else [])
    return subprocess.Popen(
        argv, env=dict(env, COMMTOP_CONNECTION_FILE=conn_path), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def feed(conn, host: str, seconds: float, rate: float) -> int:
    """8 ranks' publishers, one batch per rank every 50 ms; returns records sent."""
    import zmq

    from workers.export.tap import tap_endpoint
    from workers.rank.publisher import RecordPublisher
    from workers.wire.protocol import COLL

    ctx = zmq.Context()
    pubs = [
        RecordPublisher(conn.data, conn.key, conn.session, r, ctx=ctx, tap=tap_endpoint(conn.session, host))
        for r in range(RANKS)
    ]
    per_batch = max(1, int(rate * 0.05))
    batches = [[coll_columns(per_batch, m, r * 10**6 + m * per_batch) for m in range(4)] for r in range(RANKS)]
    sent, tick, end = 0, time.monotonic(), time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        for r, pub in enumerate(pubs):
            pub.publish(COLL, batches[r][(i // 20) % 4], per_batch, (0, -1, -1))  # mode changes every second
            sent += per_batch
        i += 1
        tick += 0.05
        time.sleep(max(0.0, tick - time.monotonic()))
    drops = sum(p.tap_dropped for p in pubs)
    for p in pubs:
        p.close(500)
    ctx.term()
    return sent - drops


def cpu_seconds(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def wait_url(run_dir: Path, host: str, timeout: float = 30.0) -> str:
    import json

    path = run_dir / f"prometheus-{host}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return str(json.loads(path.read_text())["url"])
        time.sleep(0.05)
    raise SystemExit(f"the node sampler wrote no endpoint to {path}")


def timed_scrapes(url: str, n: int) -> tuple[float, int, int]:
    """Median seconds per scrape, series (sample lines) and bytes of the last one."""
    times, text = [], ""
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        times.append(time.perf_counter() - t0)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    return statistics.median(times), len(lines), len(text)


def endpoint_records(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as reply:
        fams = text_string_to_metric_families(reply.read().decode())
    return sum(s.value for f in fams for s in f.samples if s.name == "commtop_collective_duration_seconds_count")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--seconds", type=float, default=0.0, help="feeding time per sampler run (default 10; tiny 1.5)")
    ap.add_argument("--rate", type=float, default=15000.0, help="records/s per rank (default 15000: 66 µs collectives)")
    ns = ap.parse_args(argv)
    seconds = ns.seconds or (1.5 if ns.tiny else 10.0)
    os.environ.setdefault("COMMTOP_RUNTIME_DIR", f"/tmp/commtop-bench-{os.getuid()}")
    from workers.wire import connection as connections

    conn = connections.create_run(label="prombench")
    report = Report(f"prometheus export: {RANKS} ranks at {ns.rate:,.0f} records/s each, batches every 50 ms")

    calls = 100 if ns.tiny else 1500
    plain_ns, tapped_ns, dropped = worker_side(conn, calls)
    in_rank = subprocess.run(
        [sys.executable, "-c", "import sys, workers.synthetic.main, workers.rank.publisher, workers.export.tap; "
         "print('prometheus_client' in sys.modules, 'workers.export.server' in sys.modules)"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
    ).stdout.split()  # fmt: skip
    t = report.table(
        f"worker side: publish() of one {BATCH}-record batch on the loop thread (median of {calls} calls each)",
        ["publisher", "µs per batch", "ns per record", "ratio to no tap"],
    )
    t.add("no tap (reference)", plain_ns / 1e3, plain_ns / BATCH, 1.0)
    t.add("with tap (--prometheus)", tapped_ns / 1e3, tapped_ns / BATCH, tapped_ns / plain_ns)
    t.add(
        "tap's extra", (tapped_ns - plain_ns) / 1e3, (tapped_ns - plain_ns) / BATCH, (tapped_ns - plain_ns) / plain_ns
    )
    report.notes.append(
        "The tap's extra on the loop thread is one NOBLOCK zmq enqueue of the frames publish() already sealed "
        f"(no second msgpack or HMAC); {dropped} records dropped. A rank process imports "
        f"prometheus_client: {in_rank[0]}, the exporter: {in_rank[1]} (decode, histograms and HTTP run in the "
        "node sampler process)."
    )

    host = f"bench-{os.getpid()}"
    env = dict(os.environ, COMMTOP_HOSTNAME=host, PYTHONPATH=str(ROOT))
    t = report.table(
        f"node sampler process CPU, {seconds:g} s of {RANKS} ranks feeding",
        ["sampler", "records taken", "CPU %", "CPU µs per record", "ratio to no exporter"],
    )
    base_cpu = 0.0
    sent, counted = 0, 0.0
    scrape_rows = []
    for prometheus in ("", "127.0.0.1:0"):
        proc = start_sampler(conn.path, env, prometheus)
        try:
            url = wait_url(conn.run_dir, host) if prometheus else ""
            time.sleep(1.0)  # NVML/psutil start-up is not what is measured
            empty = timed_scrapes(url, 5 if ns.tiny else 20) if url else None
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            sent = feed(conn, host, seconds, ns.rate)
            time.sleep(0.5)  # the sampler drains what is queued
            cpu, wall = cpu_seconds(proc.pid) - c0, time.monotonic() - t0
            if not prometheus:
                base_cpu = cpu
                t.add("no --prometheus (reference)", 0, 100 * cpu / wall, "–", 1.0)
                continue
            counted = endpoint_records(url)
            per_record = (cpu - base_cpu) / max(counted, 1) * 1e6
            t.add("--prometheus 127.0.0.1:0", int(counted), 100 * cpu / wall, per_record, cpu / max(base_cpu, 1e-9))
            report.notes.append(f"records sent to the tap {sent:,}; counted on the endpoint {int(counted):,}.")
            full = timed_scrapes(url, 5 if ns.tiny else 50)
            scrape_rows = [("no rank yet (reference)", *empty), (f"{RANKS} ranks x 4 modes", *full)]  # type: ignore[misc]
        finally:
            proc.terminate()
            proc.wait(5)
    t = report.table(
        "scrape of the node endpoint over HTTP (urllib, same machine)",
        ["endpoint", "ms per scrape", "series", "bytes", "ratio"],
    )
    ref = scrape_rows[0][1]
    for name, secs, series, size in scrape_rows:
        t.add(name, secs * 1e3, series, size, secs / ref)
    t = report.table("targets", ["target", "measured", "met"])
    t.add("records sent by the ranks and not counted on the endpoint: 0", sent - int(counted), sent == int(counted))
    t.add("records the tap dropped on the loop thread: 0", dropped, dropped == 0)
    imported = sum(flag == "True" for flag in in_rank)
    t.add("of prometheus_client and the exporter, modules a rank process imports: 0", imported, imported == 0)
    report.notes.append("No GPU here unless the machine line names one: GPU series (16 per GPU) are then absent.")
    finish(report, ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
