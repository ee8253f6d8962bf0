"""A synthetic worker fleet for the TUI benchmarks, in its own process (so it never takes the
receiver's GIL): real ZeroMQ PUSH sockets (one per rank, the worker's RecordPublisher with its
bounded queue and non-blocking sends), the real protocol (sealed columnar batches + Hellos).

    python benchmarks/standing/_synth_publisher.py --connection-file F --ranks 0:32 --rate 500000 --seconds 5

Every ``--batch-ms`` each rank sends one batch of ``rate / world / (1000 / batch_ms)`` small
all_reduce records whose times are real (``start_ns + dur`` just before the send), so the
receiver can also measure end-to-end latency. Prints one JSON line: records sent/dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.rank.publisher import RecordPublisher  # noqa: E402
from workers.wire import protocol as p  # noqa: E402
from workers.wire.connection import load  # noqa: E402

ALL_REDUCE = p.COLLECTIVES.index("all_reduce")
SETTINGS = {"mode": "none", "copies": 0, "copy_scale": 1.0, "pinned": True, "direction": "d2h", "knobs": {}}


def hello(rank: int, world: int, started_ns: int, iteration: int, pub: RecordPublisher) -> p.Hello:
    return p.Hello(
        rank=rank,
        world_size=world,
        local_rank=rank % 8,
        local_world_size=8,
        host=f"node-{rank // 8:03d}",
        pid=os.getpid(),
        backend="nccl",
        device="synthetic",
        device_index=rank % 8,
        gpu_uuid="",
        torch_version="-",
        nccl_version="-",
        config={
            "collective": "all_reduce",
            "shape": [1],
            "dtype": "float32",
            "tensor_bytes": 4,
            "collectives_per_step": 32,
        },
        settings=SETTINGS,
        epoch=0,
        iteration=iteration,
        pinned_bytes=0,
        t_ns=time.time_ns(),
        started_ns=started_ns,
        seq_coll=pub.seq[p.COLL],
        seq_copy=0,
        dropped=pub.dropped,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connection-file", required=True)
    ap.add_argument("--ranks", required=True, help="LO:HI (this process's ranks)")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rate", type=float, required=True, help="records/s of the whole fleet")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--batch-ms", type=float, default=50.0)
    ap.add_argument("--start-at", type=float, default=0.0, help="time.time() at which to start sending")
    ap.add_argument("--dur-us", type=float, default=64.0, help="median collective duration")
    ap.add_argument(
        "--phases",
        type=int,
        default=8,
        help="ranks send at this many evenly spaced moments of each batch interval (real ranks' batch "
        "timers start at different moments; 1 = every rank at once)",
    )
    ns = ap.parse_args()
    conn = load(ns.connection_file)
    lo, hi = (int(x) for x in ns.ranks.split(":"))
    ranks = range(lo, hi)
    pubs = {r: RecordPublisher(conn.data, conn.key, conn.session, r) for r in ranks}
    for pub in pubs.values():
        pub.wait_connected(10.0)
    per_batch = max(1, round(ns.rate / ns.world * ns.batch_ms / 1000))
    rng = np.random.default_rng(lo)
    pool = rng.lognormal(np.log(ns.dur_us), 0.15, 1 << 16).astype(np.float32)
    gap_ns = int(ns.batch_ms * 1e6 / per_batch)
    zeros_i4 = np.zeros(per_batch, dtype=np.int32)
    zeros_u1 = np.zeros(per_batch, dtype=np.uint8)
    zeros_u2 = np.zeros(per_batch, dtype="<u2")
    ops = np.full(per_batch, ALL_REDUCE, dtype=np.uint8)
    nbytes = np.full(per_batch, 4, dtype=np.int64)
    offsets = np.arange(per_batch, dtype=np.int64)
    iteration = {r: 0 for r in ranks}
    started = time.time_ns()
    if ns.start_at:
        time.sleep(max(0.0, ns.start_at - time.time()))
    cpu0 = time.process_time()
    t_end = time.monotonic() + ns.seconds
    next_tick = time.monotonic()
    next_hello = 0.0
    late = 0
    k = 0
    phases = max(1, min(ns.phases, len(ranks)))
    phase = 0
    while True:
        now = time.monotonic()
        if now >= t_end:
            break
        if now >= next_hello:
            for r, pub in pubs.items():
                pub.send_body(p.hello_body(conn.session, hello(r, ns.world, started, iteration[r], pub)))
            next_hello = now + 1.0
        for r, pub in pubs.items():
            if r % phases != phase:
                continue
            dur = pool[k : k + per_batch] if k + per_batch <= len(pool) else pool[:per_batch]
            k = (k + per_batch) % (len(pool) - per_batch)
            t = time.time_ns()
            # The newest record completes now; the others spread over the last batch interval.
            start = t - (per_batch - 1 - offsets) * gap_ns - (dur * 1000).astype(np.int64)
            it = iteration[r] + offsets
            iteration[r] += per_batch
            cols = {
                "iteration": it,
                "step": it >> 5,
                "epoch": zeros_i4,
                "mode": zeros_u1,
                "op": ops,
                "group": zeros_u2,
                "dtype": zeros_u1,
                "nbytes": nbytes,
                "host_ns": start,
                "start_ns": start,
                "dur_us": dur,
                "algbw": 4 / dur / 1e3,
                "busbw": 4 / dur / 1e3,
            }
            if k == per_batch:  # the first batch: a schema mismatch fails loudly, not as 100 % dropped
                p.batch_body(p.COLL, conn.session, p.Batch(p.COLL, r, 0, 0, cols, 0, -1, -1, t))
            pub.publish(p.COLL, cols, per_batch, (0, -1, -1))
        phase = (phase + 1) % phases
        next_tick += ns.batch_ms / 1000 / phases
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            late += 1
            if delay < -1.0:  # far behind: do not try to catch up in a burst
                next_tick = time.monotonic()
    for r, pub in pubs.items():
        pub.send_body(p.hello_body(conn.session, hello(r, ns.world, started, iteration[r], pub)))
    sent = sum(pub.sent for pub in pubs.values())
    dropped = sum(pub.dropped for pub in pubs.values())
    for pub in pubs.values():
        pub.close(linger_ms=2000)
    cpu = time.process_time() - cpu0
    print(json.dumps({"sent": sent, "dropped": dropped, "late_ticks": late, "per_batch": per_batch, "cpu_s": cpu}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
