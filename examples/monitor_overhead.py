"""What the monitor costs a job: CPU bookkeeping per record, and collective time with/without it.

    python examples/monitor_overhead.py                 # gloo/CPU, world size 1
    python examples/monitor_overhead.py --cuda          # NCCL on GPU 0, world size 1

Targets (benchmarks issue): < 2 us of CPU bookkeeping per record, <= 1 % of collective time.
1. ``hook_us``: coll_begin + coll_end of one sync all_reduce record (timer, row, harvest and
   batch encode/send amortised), measured without the collective itself, records really sent
   to a PULL socket in this process.
2. ``ab``: the same collective loop with the monitor on and off (patched vs unpatched),
   interleaved blocks, median time per call of each, and the relative difference.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workers import monitor  # noqa: E402
from workers.monitor import patch as monitor_patch
from workers.wire import connection as connections  # noqa: E402
from workers.wire import protocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hook_cost(mon: monitor.Monitor, tensor: torch.Tensor, n: int) -> float:
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    args: tuple = (tensor,)
    kwargs: dict = {}
    begin, end = mon.coll_begin, mon.coll_end
    if tensor.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        token = begin(spec, args, kwargs)
        end(token, None)
    t1 = time.perf_counter_ns()
    if tensor.is_cuda:
        torch.cuda.synchronize()
    mon.harvest()
    return (t1 - t0) / n / 1000


def ab(tensor: torch.Tensor, calls: int, blocks: int) -> dict[str, float]:
    """Median µs per all_reduce with the monitor on (patched) and off (original), interleaved."""
    on, off = [], []
    original = monitor_patch._originals["all_reduce"]
    sync = torch.cuda.synchronize if tensor.is_cuda else (lambda: None)
    for _ in range(blocks):
        for fn, out in ((dist.all_reduce, on), (original, off)):
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn(tensor)
            sync()
            out.append((time.perf_counter_ns() - t0) / calls / 1000)
        monitor.active().harvest()  # type: ignore[union-attr]
    m_on, m_off = statistics.median(on), statistics.median(off)
    return {"on_us": round(m_on, 3), "off_us": round(m_off, 3), "overhead_pct": round(100 * (m_on - m_off) / m_off, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--mib", type=float, default=None, help="all_reduce size for the A/B (default 64 GPU, 0.25 CPU)")
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=15)
    args = ap.parse_args()
    os.environ.setdefault("COMMTOP_RUNTIME_DIR", tempfile.mkdtemp(prefix="cmo-", dir="/tmp"))
    conn = connections.create_run(label="overhead")
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES + 1024)
    pull.setsockopt(zmq.RCVHWM, 100_000)
    pull.bind(conn.data)
    if args.cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl" if args.cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    mon = monitor.start(conn.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    small = torch.ones(1024, device=device)
    for _ in range(20):
        dist.all_reduce(small)
    hook_us = min(hook_cost(mon, small, args.records) for _ in range(3))
    mib = args.mib if args.mib is not None else (64.0 if args.cuda else 0.25)
    tensor = torch.ones(int(mib * 2**20) // 4, device=device)
    calls = args.calls or (50 if args.cuda else 200)
    result = {
        "device": torch.cuda.get_device_name(0) if args.cuda else "cpu",
        "backend": dist.get_backend(),
        "torch": torch.__version__,
        "hook_us_per_record": round(hook_us, 3),
        "ab_mib": mib,
        **ab(tensor, calls, args.blocks),
    }
    monitor.stop()
    received = 0
    while pull.poll(200):
        frames = pull.recv_multipart()
        body = protocol.decode(protocol.open_frames(conn.key, frames, conn.session))
        if isinstance(body, protocol.Batch) and body.kind == protocol.COLL:
            received += len(body)
    result["records_received"] = received
    result["records_dropped"] = mon.publisher.dropped
    print(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
