"""What one record costs the worker's loop thread with the CUDA-event timer (the fallback where
CUPTI cannot run), call by call, and the whole CpuTimer / CudaTimer cycle.

    python3 benchmarks/standing/cuda_timer_costs.py --out $OUT/cuda_timer_costs.md

Target: a timer cycle (begin + end + harvest of one record) < 2 µs of loop-thread CPU. Same-run
reference: one ``time.time_ns()`` call (the least any record needs); each row says how many of
those it costs. The GPU table's reference is the same device copies without the event pair.
CUPTI, the default timer on a GPU, is measured by overhead.py. Needs CUDA for the event rows;
on a CPU-only machine it reports the CpuTimer cycle only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

#: µs of loop-thread CPU per record.
TARGET_US = 2.0


def per_call_us(fn: Callable[[], object], n: int) -> float:
    c = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - c) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--n", type=int, default=0, help="calls per measure (default 100,000; tiny 2,000)")
    ns = ap.parse_args(argv)
    n = ns.n or (2_000 if ns.tiny else 100_000)
    import torch

    from workers.rank.timing import Anchor, CpuTimer, CudaTimer

    report = Report("per-record cost of the timers (loop thread CPU)")
    table = report.table(
        f"µs of loop-thread CPU per call ({n:,} calls each); reference: time.time_ns() in the same run",
        ("call", "µs", "x reference", "target", "met"),
    )
    ref_us = per_call_us(time.time_ns, n)

    def add(call: str, us: float, cycle: bool = False) -> None:
        target, met = (f"< {TARGET_US:g} µs", us < TARGET_US) if cycle else ("", "")
        table.add(call, us, us / ref_us, target, met)

    add("time.time_ns() (reference)", ref_us)
    cpu = CpuTimer()
    meta = (0, 0, 0, 0, 0)
    out: list[tuple[object, ...]] = []

    def cpu_cycle() -> None:
        cpu.end(cpu.begin(meta))
        cpu.harvest(out)
        out.clear()

    add("CpuTimer begin + end + harvest (one record)", per_call_us(cpu_cycle, n), cycle=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        b.record()
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        add("torch.cuda.Event.record() (no stream given)", per_call_us(a.record, n))
        add("Event.record(stream)", per_call_us(lambda: a.record(stream), n))
        torch.cuda.synchronize()
        add("Event.query() (done)", per_call_us(b.query, n))
        add("Event.elapsed_time(other)", per_call_us(lambda: a.elapsed_time(b), n))
        anchor_event = torch.cuda.Event(enable_timing=True)
        anchor_event.record()
        torch.cuda.synchronize()
        # As the loop builds it: every pair recorded on a stream object given once.
        timer = CudaTimer(torch, 4096, Anchor(anchor_event, time.time_ns()), torch.cuda.current_stream())

        def cuda_cycle() -> None:
            timer.end(timer.begin(meta))
            timer.harvest(out)
            out.clear()

        add("CudaTimer begin + end + harvest (one record, GPU idle)", per_call_us(cuda_cycle, n), cycle=True)
        buf = torch.empty(1, device="cuda")

        def cuda_cycle_kernel() -> None:
            timer.end(timer.begin(meta))
            buf.add_(1)
            timer.harvest(out)
            out.clear()

        add("  same + a tiny kernel in between", per_call_us(cuda_cycle_kernel, n))
        add("  a tiny kernel alone (buf.add_(1))", per_call_us(lambda: buf.add_(1), n))
        torch.cuda.synchronize()
        gpu = report.table(
            "GPU time per op of back-to-back device copies (~the H200's ws=1 all_gather), measured by one "
            "event pair around 500 ops: bare, and with the per-collective event pair of CudaTimer around each",
            ("ops", "bare µs/op", "with 2 events/op µs/op", "ratio"),
        )
        for mib in (128, 8):
            src = torch.ones(mib << 19, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            results = []
            for with_events in (False, True, False, True):
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                t0.record()
                for _ in range(500):
                    if with_events:
                        timer.end(timer.begin(meta))  # same events as a timed collective, empty
                        dst.copy_(src)
                        timer.harvest(out)
                        out.clear()
                    else:
                        dst.copy_(src)
                t1.record()
                torch.cuda.synchronize()
                results.append(t0.elapsed_time(t1) * 1000 / 500)
            bare, timed = min(results[0], results[2]), min(results[1], results[3])
            gpu.add(f"copy {mib} MiB", bare, timed, f"{timed / bare:.4f}")
    else:
        report.notes.append("no CUDA here: only the CPU timer was measured")
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
