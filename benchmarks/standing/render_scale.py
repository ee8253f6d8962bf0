"""Rendering at scale: 8, 64 and 512 ranks refreshed at 15 Hz (targets: 64 ranks <= 25 % of one
core; 512 ranks readable, as the heat map, and <= 50 %).

    python benchmarks/standing/render_scale.py [--ranks 8,64,512] [--seconds 6]

The real app (headless ``run_test``, snapshot interval 1/15 s; no event-loop lag probe, whose
100 Hz task would count as the app's CPU) is fed by synthetic publisher
processes at a realistic rate per rank (a 2.7 ms all_gather: ~370 records/s per rank, in 50 ms
batches), so every snapshot has new data for every rank. Measured: the snapshot build time
(ingest thread), the frame time (snapshot applied + painted, UI thread), and the CPU of the
app process split by thread, over the steady part of the run.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]
from _tui_probe import drive, reference_paint

#: CPU % of one core (targets: 8 ranks <= 15 %, 64 <= 25 %, 512 <= 50 %) and frames/s.
TARGETS = {8: 15.0, 64: 25.0, 512: 50.0}
FPS_TARGETS = {8: 15.0, 64: 15.0, 512: 10.0}
HZ = 15.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--ranks", default="", help="comma-separated rank counts (default 8,64,512; tiny 8,64)")
    ap.add_argument("--seconds", type=float, default=0.0, help="per rank count (default 6; tiny 1.5)")
    ap.add_argument("--per-rank", type=float, default=370.0, help="records/s per rank")
    ap.add_argument("--size", default="160x50", help="terminal size")
    ap.add_argument("--screenshots", default="", help="save an SVG of the screen per rank count in this folder")
    ns = ap.parse_args(argv)
    counts = [int(x) for x in (ns.ranks or ("8,64" if ns.tiny else "8,64,512")).split(",")]
    seconds = ns.seconds or (1.5 if ns.tiny else 6.0)
    w, h = (int(x) for x in ns.size.split("x"))

    report = Report(f"render scale: {HZ:g} Hz snapshots, {w}x{h} terminal, {ns.per_rank:g} records/s per rank")
    table = report.table(
        "per rank count; CPU % of one core over the steady part",
        (
            "ranks",
            "view",
            "grid lines (screen)",
            "snapshot p50 ms",
            "snapshot p99 ms",
            "frames/s",
            "frame p50 ms",
            "frame p99 ms",
            "apply p50 ms",
            "paint p50 ms",
            "TUI CPU %",
            "ingest thr %",
            "UI thr %",
            "CPU / reference",
            "target",
            "met",
        ),
    )
    # The same-run reference: a bare Textual app redrawing the whole screen at the same rate
    # (tui-free), so a slower or busier machine is seen in both numbers.
    ref = asyncio.run(reference_paint((w, h), HZ, max(1.0, seconds * 0.8 - 0.3)))
    ref_table = report.table(
        "same-run reference: a bare Textual app redrawing every line of the screen at 15 Hz",
        ("app", "frames/s", "paint p50 ms", "CPU %"),
    )
    ref_window = max(1.0, seconds * 0.8 - 0.3)
    ref_table.add("reference (textual only)", ref.frames / ref_window, ref.p(50), ref.cpu_pct)
    shots = Path(ns.screenshots) if ns.screenshots else None
    for n in counts:
        shot = ""
        if shots is not None:
            shots.mkdir(parents=True, exist_ok=True)
            shot = str(shots / f"render_{n}_ranks.svg")
        lv = asyncio.run(
            drive(
                n * ns.per_rank,
                n,
                seconds,
                2,
                (w, h),
                interval_s=1 / HZ,
                dur_us=2700.0,
                screenshot=shot,
                lag_probe=False,  # the lag is not reported here; its 100 Hz task cost 2-4 % of a core
            )
        )
        target = TARGETS.get(n)
        fps_target = FPS_TARGETS.get(n)
        window = max(0.2, seconds * 0.8 - 0.3)
        fps = lv.frames / window
        table.add(
            n,
            lv.view,
            f"{lv.lines} ({lv.screen_lines})",
            lv.p("snapshot_ms", 50),
            lv.p("snapshot_ms", 99),
            fps,
            lv.p("frame_ms", 50),
            lv.p("frame_ms", 99),
            lv.p("apply_ms", 50),
            lv.p("paint_ms", 50),
            lv.cpu_pct,
            lv.ingest_pct,
            lv.ui_pct,
            lv.cpu_pct / ref.cpu_pct if ref.cpu_pct > 0 else float("nan"),
            f">= {fps_target:g} fps, <= {target:g} %" if target and fps_target else "-",
            (lv.cpu_pct <= target and fps >= fps_target * 0.97 and (n < 512 or lv.view == "heat"))
            if target and fps_target
            else None,
        )
        if lv.lost:
            report.notes.append(f"{n} ranks: {lv.lost} records lost (the rate here is far below the ingest limit)")
    report.notes.append(
        "frames/s below 15 means the app coalesced snapshots (it never queues more than one); "
        "snapshot = RunModel.snapshot on the ingest thread; frame = show_snapshot + the paint that follows."
    )
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
