"""Records/s into the real TUI (target: >= 1,000,000/s with no drops and frames < 100 ms, 64 ranks
of small all_reduces, on this 2-core machine).

    python benchmarks/standing/ingest_rate.py [--ranks 64] [--rates 250000,500000,...]

For each offered rate: synthetic publisher processes (``_synth_publisher.py``: real PUSH
sockets and the worker's RecordPublisher, real sealed batches every 50 ms per rank) feed
the real app (``CommtopApp`` + ``LiveSource`` + ``IngestLoop``, headless ``run_test``, normal
refresh). Measured: records the model applied per second, drops anywhere (publisher queue
full, lost in transit, refused frames), how long the backlog took to drain after the
publishers stopped, frame time (snapshot applied + painted), event-loop lag, and the CPU of
the TUI process split into its ingest thread and its UI thread.
"""

from __future__ import annotations

import argparse
import asyncio

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]
from _tui_probe import drive, reference_paint

RATE_TARGET = 1_000_000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--ranks", type=int, default=0, help="synthetic ranks (default 64; tiny 8)")
    ap.add_argument("--rates", default="", help="offered records/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=0.0, help="per rate (default 5; tiny 1.5)")
    ap.add_argument("--processes", type=int, default=2, help="publisher processes")
    ap.add_argument("--size", default="160x50", help="terminal size")
    ns = ap.parse_args(argv)
    ranks = ns.ranks or (8 if ns.tiny else 64)
    seconds = ns.seconds or (1.5 if ns.tiny else 5.0)
    default_rates = "40000" if ns.tiny else "250000,500000,1000000,1500000,2000000"
    rates = [float(r) for r in (ns.rates or default_rates).split(",")]
    w, h = (int(x) for x in ns.size.split("x"))

    report = Report(f"ingest: records/s into the TUI ({ranks} ranks of small all_reduce, {w}x{h} terminal)")
    table = report.table(
        f"one row per offered rate ({seconds:g} s each); ok = no drops, backlog drained < 0.5 s, frame p99 < 100 ms",
        (
            "offered rec/s",
            "applied rec/s",
            "sent",
            "lost",
            "drain s",
            "frames",
            "frame p50 ms",
            "frame p99 ms",
            "frame max ms",
            "loop lag p99 ms",
            "TUI CPU %",
            "ingest thr %",
            "UI thr %",
            "publishers CPU %",
            "TUI CPU / reference",
            "ok",
        ),
    )
    ref = asyncio.run(reference_paint((w, h), 1 / 0.08, max(1.0, seconds * 0.8 - 0.3)))
    best = 0.0
    for rate in rates:
        lv = asyncio.run(drive(rate, ranks, seconds, ns.processes, (w, h)))
        table.add(
            int(rate),
            lv.in_window,
            lv.sent,
            lv.lost,
            lv.drain_s,
            lv.frames,
            lv.p("frame_ms", 50),
            lv.p("frame_ms", 99),
            lv.p("frame_ms", 100),
            lv.p("lag_ms", 99),
            lv.cpu_pct,
            lv.ingest_pct,
            lv.ui_pct,
            lv.pub_cpu_pct,
            lv.cpu_pct / ref.cpu_pct if ref.cpu_pct > 0 else float("nan"),
            lv.ok,
        )
        if lv.ok:
            best = max(best, float(lv.in_window))
        if lv.late_ticks:
            report.notes.append(f"at {int(rate):,}/s the publishers missed {lv.late_ticks} of their 50 ms ticks")
    summary = report.table("result", ("highest sustained rate with no drops (rec/s)", "target", "met"))
    summary.add(int(best), f">= {RATE_TARGET:,}", best >= RATE_TARGET)
    ref_table = report.table(
        "same-run reference: a bare Textual app redrawing every line of the screen at the app's 12.5 Hz",
        ("app", "paint p50 ms", "CPU %"),
    )
    ref_table.add("reference (textual only)", ref.p(50), ref.cpu_pct)
    report.notes.append(
        "CPU % is of one core; TUI = the whole app process (ingest thread + UI thread + ZeroMQ I/O thread); "
        "the publishers run in separate processes on the same 2 cores."
    )
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
