"""What the no-code-change capture (workers.capture) costs a collectives loop, and how its
durations agree with CUDA events. One GPU, NCCL world size 1:

    python3 benchmarks/probes/capture_overhead.py --out $OUT          # ~2 min on an H200

Blocks alternate (ABC / CBA per pair) between
* bare: collectives on a process group without timing, nothing else;
* events: today's path, a CUDA event pair per collective on the issuing stream, harvested
  with query() every 64 (no publishing);
* capture: collectives on a group with NCCL timing on (what TORCH_NCCL_ENABLE_TIMING=1 gives
  every group under the bootstrap), CUPTI MEMCPY on, and workers.capture.cuda_capture's
  drain (Flight Recorder at its GIL-bounded rate, CUPTI copies) feeding a MonitorBatcher
  whose publisher drops batches (the encoding is done, the send is not).
The Flight Recorder ring is torch's default (TORCH_FR_BUFFER_SIZE unset). Reported: wall time
per collective and its ratio to bare in the same pair (mean, 95 % CI), loop-thread CPU per
collective (time.thread_time_ns), and the capture's own CPU per record off the loop thread.
Then agreement: p50 of the capture's durations (FR for collectives, CUPTI for copies) against
CUDA events around the same work, per offload mode, with the collectives host-paced and
queued behind a GPU sleep (so launch latency is outside every measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from capture_probe import EventRing, dump, enable_timing, init_dist, t_ci  # noqa: E402

from workers.capture.cuda_capture import CaptureThread, CuptiCopies, FlightRecorderSource, fr_dump_function  # noqa: E402
from workers.capture.rows import StepTimeline  # noqa: E402
from workers.monitor.records import MonitorBatcher  # noqa: E402
from workers.rank.publisher import NullPublisher  # noqa: E402

OUT: dict[str, Any] = {}


def say(msg: str) -> None:
    print(msg, flush=True)
    OUT.setdefault("log", []).append(msg)


class Sink:
    """The monitor as CaptureThread sees it: rows batched (columns built), sends dropped."""

    def __init__(self) -> None:
        self._epoch = 0
        self._mode = 0
        self.status = SimpleNamespace(iteration=0, untimed=0)
        self.batcher = MonitorBatcher(NullPublisher(), lambda: (0, -1, -1), batch_ms=50.0)
        self.colls = 0
        self.copies = 0

    def add_records(self, coll: list[Any], copy: list[Any]) -> None:
        self.colls += len(coll)
        self.copies += len(copy)
        b = self.batcher
        b.coll_rows.extend(coll)
        b.copy_rows.extend(copy)
        if b.due():
            b.flush()

    def add_coll_array(self, records: Any) -> None:
        self.colls += len(records)
        b = self.batcher
        b.add_array(records)
        if b.due():
            b.flush()


class TimedCopies(CuptiCopies):
    """CuptiCopies; ``cpu_ns`` (CUPTI's decode callbacks) and ``activities`` come from the client."""

    skip_thread: Any = None  # kept for the call site; the client's callbacks run on CUPTI's thread only


class Driver:
    """Runs CaptureThread.drain every TICK on a thread, only while a capture block runs."""

    def __init__(self, capture: CaptureThread) -> None:
        self.capture = capture
        self.active = threading.Event()
        self.cpu_ns = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while True:
            self.active.wait()
            t0 = time.thread_time_ns()
            self.capture.drain(force_fr=False)
            self.cpu_ns += time.thread_time_ns() - t0
            time.sleep(0.5)


def overhead(dist: Any, timed: Any, untimed: Any, copies: TimedCopies, driver: Driver, sink: Sink, pairs: int) -> None:
    import torch

    dev = torch.device("cuda", 0)
    cupti = copies.cupti
    x_big = torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16)
    out_big = torch.empty_like(x_big)
    x_small = torch.ones(1, device=dev)
    src = torch.ones(64 << 20, dtype=torch.uint8, device=dev)
    host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    side = torch.cuda.Stream()

    def with_events(ring: Any, fn: Any) -> None:
        if ring is None:
            fn()
        else:
            i = ring.begin()  # on the current stream
            fn()
            ring.finish(i)

    def all_gather(group: Any, ring: Any) -> None:
        with_events(ring, lambda: dist.all_gather_into_tensor(out_big, x_big, group=group))

    def all_reduce(group: Any, ring: Any) -> None:
        with_events(ring, lambda: dist.all_reduce(x_small, group=group))

    def forum_step(group: Any, ring: Any) -> None:  # an offload copy on a side stream, then 16 all_gathers
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with_events(ring, lambda: host.copy_(src, non_blocking=True))
        for _ in range(16):
            with_events(ring, lambda: dist.all_gather_into_tensor(out_big, x_big, group=group))

    loads = {
        "all_gather 8192x8192 bf16": (all_gather, 3000, 1),
        "all_reduce 1 x fp32": (all_reduce, 20000, 1),
        "16 all_gather + 64 MiB D2H": (forum_step, 150, 17),
    }
    variants = ("bare", "events", "capture")
    res: dict[str, Any] = {}
    for name, (op, n, records_per_op) in loads.items():

        def block(v: str, n: int = n, op: Any = op) -> tuple[float, float]:
            group = timed if v == "capture" else untimed
            ring = EventRing(torch) if v == "events" else None
            if v == "capture":
                cupti.activity_enable(cupti.ActivityKind.MEMCPY)
                driver.active.set()
            for _ in range(10):
                op(group, None)
            torch.cuda.synchronize()
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            for _ in range(n):
                op(group, ring)
            torch.cuda.synchronize()
            w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            if v == "capture":
                driver.active.clear()
                cupti.activity_flush_all(1)
                cupti.activity_disable(cupti.ActivityKind.MEMCPY)
            return (w1 - w0) / n / 1e3, (c1 - c0) / n / 1e3

        block("bare", max(n // 4, 10))
        walls: dict[str, list[float]] = {v: [] for v in variants}
        cpus: dict[str, list[float]] = {v: [] for v in variants}
        cap0 = (driver.cpu_ns, copies.cpu_ns, sink.colls, sink.copies, copies.activities)
        for p in range(pairs):
            for v in variants if p % 2 == 0 else tuple(reversed(variants)):
                w, c = block(v)
                walls[v].append(w)
                cpus[v].append(c)
        time.sleep(0.6)
        driver.capture.drain(force_fr=True)  # what the last capture block left, into the counts
        cap1 = (driver.cpu_ns, copies.cpu_ns, sink.colls, sink.copies, copies.activities)
        row: dict[str, Any] = {"records_per_op": records_per_op, "ops_per_block": n}
        for v in variants:
            rm, rci = t_ci([walls[v][i] / walls["bare"][i] for i in range(pairs)])
            cm, cci = t_ci([(cpus[v][i] - cpus["bare"][i]) / records_per_op for i in range(pairs)])
            row[v] = {
                "wall_us_per_op": statistics.median(walls[v]),
                "ratio": rm,
                "ratio_ci95": rci,
                "loop_cpu_us_per_op": statistics.median(cpus[v]),
                "extra_loop_cpu_us_per_record": cm,
                "extra_loop_cpu_ci95": cci,
            }
            say(
                f"overhead {name:28s} {v:8s} wall {row[v]['wall_us_per_op']:9.2f} us/op  ratio {rm:.4f} +- {rci:.4f}  "
                f"loop CPU/record {cm:+6.2f} +- {cci:.2f} us"
            )
        records = (cap1[2] - cap0[2]) + (cap1[3] - cap0[3])
        row["capture_off_loop"] = {
            "records": records,
            "collectives": cap1[2] - cap0[2],
            "copies": cap1[3] - cap0[3],
            "cupti_activities": cap1[4] - cap0[4],
            "drain_cpu_ms": (cap1[0] - cap0[0]) / 1e6,
            "cupti_callback_cpu_ms": (cap1[1] - cap0[1]) / 1e6,
            "us_per_record": ((cap1[0] - cap0[0]) + (cap1[1] - cap0[1])) / 1e3 / max(records, 1),
            "expected_collectives": pairs * (n + 10) * (16 if name.startswith("16") else 1),
            "expected_copies": pairs * (n + 10) if name.startswith("16") else 0,
        }
        say(f"overhead {name:28s} capture off the loop thread: {row['capture_off_loop']}")
        res[name] = row
    fr = driver.capture.fr
    res["fr"] = {
        "dumps": fr.dumps,
        "last_dump_s": fr.last_cost_s,
        "lost": fr.cursor.lost,
        "untimed": fr.cursor.untimed,
    }
    say(f"overhead FR source: {res['fr']}")
    OUT["overhead"] = res


def agreement(dist: Any, timed: Any, untimed: Any, copies: TimedCopies, steps: int) -> None:
    """p50 durations per mode: events (issuing stream) vs FR (NCCL stream) vs CUPTI."""
    import pickle

    import torch

    from workers.capture.cupti_copies import ClockMap, decode_copy
    from workers.capture.flight_recorder import FrCursor

    dev = torch.device("cuda", 0)
    cupti = copies.cupti
    x = torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    src = torch.ones(8192 * 8192, device=dev, dtype=torch.bfloat16)
    hosts = [torch.empty(src.shape, dtype=src.dtype, pin_memory=True) for _ in range(5)]
    side = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    res: dict[str, Any] = {}
    for paced in ("host-paced", "queued"):
        for mode in ("none", "overlap", "sync", "sync-barrier"):
            cursor = FrCursor()
            cursor.read(pickle.loads(dump()))  # what is in the ring already
            copies.queue.clear()
            cupti.activity_enable(cupti.ActivityKind.MEMCPY)
            coll_ev, copy_ev = [], []
            for _ in range(steps):
                if mode != "none":
                    side.wait_stream(cur)
                    with torch.cuda.stream(side):
                        for h in hosts:
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            s.record(side)
                            h.copy_(src, non_blocking=True)
                            e.record(side)
                            copy_ev.append((s, e))
                    if mode.startswith("sync"):
                        side.synchronize()
                    if mode == "sync-barrier":
                        dist.barrier(group=untimed)
                if paced == "queued":
                    torch.cuda._sleep(4_000_000)  # ~2 ms: the 32 collectives queue up behind it
                for _ in range(32):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    dist.all_gather_into_tensor(out, x, group=timed)
                    e.record()
                    coll_ev.append((s, e))
            torch.cuda.synchronize()
            time.sleep(0.6)
            cupti.activity_flush_all(1)
            cupti.activity_disable(cupti.ActivityKind.MEMCPY)
            fr = [c.dur_us / 1e3 for c in cursor.read(pickle.loads(dump())) if c.op == "all_gather"]
            clock = ClockMap()
            cp = [decode_copy(r, clock) for r in list(copies.queue)]
            d2h = [c.dur_us / 1e3 for c in cp if c is not None and c.direction == "d2h" and c.nbytes == src.nbytes]
            ev_coll = [s.elapsed_time(e) for s, e in coll_ev]
            ev_copy = [s.elapsed_time(e) for s, e in copy_ev]
            row: dict[str, Any] = {
                "collectives": len(ev_coll),
                "fr_records": len(fr),
                "events_coll_p50_ms": statistics.median(ev_coll),
                "fr_coll_p50_ms": statistics.median(fr) if fr else None,
            }
            if fr:
                row["fr_vs_events"] = row["fr_coll_p50_ms"] / row["events_coll_p50_ms"]
            if ev_copy:
                row["copies"] = len(ev_copy)
                row["cupti_copies"] = len(d2h)
                row["events_copy_p50_ms"] = statistics.median(ev_copy)
                row["cupti_copy_p50_ms"] = statistics.median(d2h) if d2h else None
                if d2h:
                    row["cupti_vs_events"] = row["cupti_copy_p50_ms"] / row["events_copy_p50_ms"]
                    row["cupti_copy_gbps_p50"] = src.nbytes / (row["cupti_copy_p50_ms"] * 1e6)
            row["cupti_activities_so_far"] = copies.activities
            row["cupti_queue"] = len(copies.queue)
            res[f"{paced}/{mode}"] = row
            say(f"agreement {paced:10s} {mode:12s} {json.dumps(row)}")
    OUT["agreement"] = res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ns = ap.parse_args()
    os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    os.environ.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    copies = TimedCopies()
    import torch

    dist = init_dist()
    timed = dist.new_group(backend="nccl")
    enable_timing(timed)
    untimed = dist.new_group(backend="nccl")
    OUT["machine"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    copies.start()
    cupti = copies.cupti
    cupti.activity_flush_period(200)
    cupti.activity_disable(cupti.ActivityKind.MEMCPY)
    sink = Sink()
    capture = CaptureThread(sink, StepTimeline(), FlightRecorderSource(fr_dump_function()), copies)
    driver = Driver(capture)
    copies.skip_thread = driver.thread
    try:
        overhead(dist, timed, untimed, copies, driver, sink, ns.pairs)
    except Exception:
        import traceback

        say("overhead failed: " + traceback.format_exc())
    try:
        agreement(dist, timed, untimed, copies, ns.steps)
    except Exception:
        import traceback

        say("agreement failed: " + traceback.format_exc())
    with open(os.path.join(ns.out, "capture_overhead.json"), "w") as f:
        json.dump(OUT, f, indent=1, default=str)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
