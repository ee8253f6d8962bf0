"""``commtop report``: the command line over the report's parts (what it reads, the builder,
the text, compare, trace, plot).

It sits above :mod:`tui.report.build`, :mod:`tui.report.text` and :mod:`tui.report.compare`,
so none imports its caller (compare builds on the rows; the builder knows nothing of compare).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace

from tui.recordings.pages import collector_paused, heap_kept, small_pages
from tui.recordings.reader import RecordingError, open_recording
from tui.report import compare
from tui.report.build import build_report
from tui.report.nccl_tests import MeasuredPeaks, PeakFileError, load_peaks
from tui.report.reading import report_columns, report_tables, window_span, window_tables
from tui.report.rows import Report
from tui.report.text import format_csv, format_json, format_table, write_records_csv

#: Traces larger than this get a warning: browsers give up near 1 GB.
TRACE_WARN_BYTES = 500_000_000


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """`commtop report`'s options, on its subparser (tui.cli)."""
    ap.description = (
        "Summarise a commtop recording per settings epoch and rank; export CSV, a Perfetto trace or a plot; "
        "or compare recordings per offload mode (commtop report A B)."
    )
    ap.add_argument(
        "file",
        nargs="+",
        help="a .commtop recording; two or more: compare them per offload mode, each against the first",
    )
    ap.add_argument("--format", choices=("table", "json", "csv"), default=None, help="report format (default table)")
    ap.add_argument("--records", action="store_true", help="with --format csv: one row per collective record")
    ap.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace (open in ui.perfetto.dev)")
    ap.add_argument("--plot", metavar="OUT.png", help="plot latency per rank by mode, and link throughput (matplotlib)")
    ap.add_argument("-o", "--output", metavar="PATH", help="write the report here instead of stdout")
    ap.add_argument(
        "--peak",
        action="append",
        default=[],
        metavar="NCCL_TESTS.json",
        help="measured peaks: an nccl-tests -J output (e.g. all_gather_perf ... -J ag.json); each row's busbw "
        "as a share of the busbw it measured for that op and size (repeat for several ops)",
    )
    ap.add_argument(
        "--window",
        metavar="FROM:TO",
        type=_window_arg,
        help="only records that start FROM..TO seconds after the first one (either may be empty), e.g. 60:90 "
        "(large recordings make traces too big for a browser)",
    )


def run(ns: argparse.Namespace) -> int:
    """`commtop report ...`: 0 on success, 1 on a file that is not a recording or a failed write."""
    with small_pages(), heap_kept(), collector_paused():  # a one-shot pass over hundreds of MB (tui.recordings.pages)
        return _run(ns)


def _err(message: str) -> int:
    print(f"commtop report: error: {message}", file=sys.stderr)
    return 1


def _window_arg(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        window = (float(lo) if lo.strip() else 0.0, float(hi) if hi.strip() else math.inf)
    except ValueError:
        window = (math.nan, math.nan)
    if not sep or not window[0] <= window[1]:
        raise argparse.ArgumentTypeError(f"expected FROM:TO in seconds (FROM <= TO), got {text!r}")
    return window


def _measured(ns: argparse.Namespace) -> list[MeasuredPeaks]:
    """The --peak files, read before any recording (a bad one: PeakFileError, one line)."""
    peaks = [load_peaks(path) for path in getattr(ns, "peak", None) or ()]
    ops = [m.op for m in peaks]
    if len(set(ops)) != len(ops):
        raise PeakFileError(f"--peak: two files measure the same collective ({', '.join(ops)})")
    return peaks


def _run(ns: argparse.Namespace) -> int:
    if ns.records and ns.format not in (None, "csv"):
        return _err("--records needs --format csv")
    try:
        ns.measured = _measured(ns)
    except PeakFileError as exc:
        return _err(str(exc))
    if len(ns.file) > 1:
        return run_compare(ns)
    ns.file = ns.file[0]
    fmt = ns.format or ("csv" if ns.records else None)
    if fmt is None and not (ns.trace or ns.plot):
        fmt = "table"
    if ns.plot:  # fail before reading a big file
        from tui.report.plot import matplotlib_missing

        missing = matplotlib_missing()
        if missing:
            return _err(missing)
    try:
        rec = open_recording(ns.file)
    except RecordingError as exc:
        return _err(str(exc))
    with rec:
        if rec.summary() and not (fmt == "table" and not ns.output):  # the table on stdout says it itself
            print(f"commtop report: warning: {rec.summary()}", file=sys.stderr)
        if ns.records or ns.trace:
            tables = rec.tables()
        elif ns.plot or ns.window:  # every record's start time and bandwidths
            tables = rec.tables(coll_columns=report_columns(rec))
        else:
            tables = report_tables(rec)
        if ns.window:
            tables = window_tables(tables, ns.window)
        try:
            if ns.trace:
                from tui.report.trace import write_trace

                events = write_trace(rec, tables, ns.trace)
                print(
                    f"commtop report: wrote {events:,} trace events to {ns.trace} (open in https://ui.perfetto.dev)",
                    file=sys.stderr,
                )
                size = os.path.getsize(ns.trace)
                if size > TRACE_WARN_BYTES:
                    print(
                        f"commtop report: warning: the trace is {size / 1e9:.1f} GB; browsers give up near 1 GB: "
                        "pick a part with --window FROM:TO (seconds)",
                        file=sys.stderr,
                    )
            if ns.plot:
                from tui.report.plot import plot_recording

                plot_recording(rec, tables, ns.plot)
                print(f"commtop report: wrote {ns.plot}", file=sys.stderr)
            if fmt is None:
                return 0
            out = open(ns.output, "w", newline="") if ns.output else sys.stdout  # noqa: SIM115
            try:
                if ns.records:
                    write_records_csv(tables, out)
                else:
                    report = _windowed(build_report(rec, tables, ns.measured), ns.window)
                    out.write({"table": format_table, "json": format_json, "csv": format_csv}[fmt](report))
            finally:
                if out is not sys.stdout:
                    out.close()
        except BrokenPipeError:  # `commtop report ... | head`: fine, and no noise at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except OSError as exc:
            return _err(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    return 0


def _windowed(report: Report, window: tuple[float, float] | None) -> Report:
    """With ``--window``, the report speaks of the window's seconds, not the whole file's."""
    if not window:
        return report
    lo, hi = window_span(window, report.duration_s)
    return replace(report, duration_s=hi - lo, window_s=(lo, hi))


def run_compare(ns: argparse.Namespace) -> int:
    """`commtop report A B ...`: one summary per recording, lined up per mode (tui.report.compare)."""

    if ns.records or ns.trace or ns.plot:
        return _err("--records, --trace and --plot take one recording; compare with `commtop report A B` alone")
    reports = []
    for path in ns.file:
        try:
            rec = open_recording(path)
        except RecordingError as exc:
            return _err(str(exc))
        with rec:
            if rec.summary():
                print(f"commtop report: warning: {path}: {rec.summary()}", file=sys.stderr)
            if ns.window:
                tables = window_tables(rec.tables(coll_columns=report_columns(rec)), ns.window)
            else:
                tables = report_tables(rec)
            reports.append(_windowed(build_report(rec, tables, ns.measured), ns.window))
    text = {"table": compare.format_table, "json": compare.format_json, "csv": compare.format_csv}[
        ns.format or "table"
    ](compare.compare(reports))
    try:
        if ns.output:
            with open(ns.output, "w", newline="") as out:
                out.write(text)
        else:
            sys.stdout.write(text)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        return _err(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    return 0
