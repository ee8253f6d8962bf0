"""Does a Flight Recorder dump through torch's worker server stall the job's collectives? One
NCCL rank (world size 1, timing on, a full ring) times the host side of each ``all_reduce`` call
(enqueue: where torch records the entry in the ring, under the recorder's lock) with nobody
dumping, then while a thread dumps the ring back to back through the worker server (pickle, as
the capture reads it), then while it polls only the cheap status dump. Prints one JSON line per
phase: calls/s, enqueue p50/p99/max, the time spent above the quiet phase's p50 (the stall),
and the dumps' count and mean wall time. Needs a GPU.

    TORCH_FR_BUFFER_SIZE=8192 torchrun --standalone --nproc-per-node 1 benchmarks/probes/fr_dump_stall.py
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time

os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "8192")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from workers.capture.fr_source import ServerDump, WorkerServer, nccl_status, post  # noqa: E402

CALLS = int(os.environ.get("CALLS", "20000"))


def phase(name: str, t: torch.Tensor, background: str, server: WorkerServer, quiet_p50: float | None) -> float:
    stop = threading.Event()
    walls: list[float] = []

    def dumper() -> None:
        reader = ServerDump(server.path)
        status = nccl_status()
        while not stop.is_set():
            t0 = time.perf_counter()
            if background == "dump":
                post(server.path, reader.query)
            else:
                assert status is not None
                status()
                time.sleep(0.02)
            walls.append(time.perf_counter() - t0)

    th = threading.Thread(target=dumper, daemon=True)
    if background != "none":
        th.start()
    times = []
    t_start = time.perf_counter()
    for i in range(CALLS):
        a = time.perf_counter_ns()
        dist.all_reduce(t)
        times.append(time.perf_counter_ns() - a)
        if i % 200 == 199:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    span = time.perf_counter() - t_start
    stop.set()
    if background != "none":
        th.join()
    times.sort()
    p50 = times[len(times) // 2] / 1e3
    ref = quiet_p50 if quiet_p50 is not None else p50
    excess = sum(max(0.0, x / 1e3 - ref) for x in times) / 1e6
    print(
        "fr_dump_stall: "
        + json.dumps(
            {
                "phase": name,
                "ring": int(os.environ["TORCH_FR_BUFFER_SIZE"]),
                "calls_per_s": round(CALLS / span),
                "enqueue_us_p50": round(p50, 2),
                "p99": round(times[int(len(times) * 0.99)] / 1e3, 2),
                "max": round(times[-1] / 1e3, 1),
                "stall_s": round(excess, 4),
                "stall_share": round(excess / span, 4),
                "span_s": round(span, 3),
                "dumps": len(walls),
                "dump_wall_ms_mean": round(1e3 * sum(walls) / len(walls), 2) if walls else None,
            }
        ),
        flush=True,
    )
    return p50


def main() -> None:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    folder = tempfile.mkdtemp(prefix="frstall-")
    server = WorkerServer(folder, "fr.sock")
    t = torch.ones(256, device="cuda")
    for _ in range(int(os.environ["TORCH_FR_BUFFER_SIZE"]) + 100):  # fill the ring
        dist.all_reduce(t)
    torch.cuda.synchronize()
    quiet = phase("quiet", t, "none", server, None)
    phase("status polls every 20 ms", t, "status", server, quiet)
    phase("dumps back to back", t, "dump", server, quiet)
    phase("quiet again", t, "none", server, quiet)
    server.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
