"""What the monitor's hooks cost the job's thread on the first collective after the job computed
for longer than a batch interval (gloo, CPU, a world of one; the collective itself not run).

    python3 benchmarks/probes/after_a_gap.py [--gap-s 0.1] [--n 60]

A user's job spends most of a step computing and issues a few collectives; whatever commtop does
in the first hook after such a gap lands inside the call the job times. Prints the median, p90
and max of the wall time and of the job-thread CPU of ``coll_begin + coll_end``, the same for
back-to-back calls, and a plain ``torch.ones(3)`` after a gap (the same run's references: any
first call after a sleep pays for cold caches), with the machine. ``--n`` gaps, half of them
for the torch reference.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gap-s", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=120)
    ns = ap.parse_args()
    os.environ.setdefault("COMMTOP_RUNTIME_DIR", tempfile.mkdtemp(prefix="cmg-", dir="/tmp"))
    import torch
    import torch.distributed as dist
    import zmq

    from workers import monitor
    from workers.monitor import patch as monitor_patch
    from workers.wire import connection as connections

    conn = connections.create_run(label="after-a-gap")
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.bind(conn.data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    mon = monitor.start(conn.path, wait_s=2.0, sampler=False, batch_ms=50.0)
    monitor.patch_distributed()
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    args = (torch.ones(16384),)
    begin, end = mon.coll_begin, mon.coll_end

    def one() -> tuple[float, float]:
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        end(begin(spec, args, {}), None)
        return (time.perf_counter_ns() - w) / 1e3, (time.thread_time_ns() - c) / 1e3

    def torch_call() -> tuple[float, float]:
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        torch.ones(3)
        return (time.perf_counter_ns() - w) / 1e3, (time.thread_time_ns() - c) / 1e3

    after_gap, back_to_back, cold_torch = [], [], []
    for i in range(ns.n):
        time.sleep(ns.gap_s)
        if i % 2:  # every other gap: what any first call pays after one (caches, clocks)
            cold_torch.append(torch_call())
            continue
        after_gap.append(one())
        back_to_back.append(one())
        while pull.poll(0):
            pull.recv_multipart()
    monitor.stop()
    dist.destroy_process_group()
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"{ns.n} gaps of {ns.gap_s} s: after one, two hooked calls (coll_begin + coll_end); after the next, torch.ones(3)"
    )
    print("call                      wall µs p50    p90     max  | job-thread CPU µs p50    p90     max")
    rows = (
        ("first after the gap", after_gap),
        ("the next (reference)", back_to_back),
        ("torch.ones(3) after one", cold_torch),
    )
    for label, xs in rows:
        parts = []
        for i in (0, 1):  # wall, then job-thread CPU
            v = sorted(x[i] for x in xs)
            parts.append(f"{statistics.median(v):8.1f} {v[int(0.9 * (len(v) - 1))]:8.1f} {v[-1]:8.1f}")
        print(f"{label:<24} {parts[0]}  | {parts[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
