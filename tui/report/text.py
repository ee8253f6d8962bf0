"""A report as text: the table (`commtop report FILE`), JSON, CSV with a row per epoch, rank and
stream, and CSV with a row per collective record (``--records``). A run without modes (a user's
job without a mode knob) leaves the synthetic loop's settings, modes and slowdown out
(:data:`tui.report.rows.LOOP_FIELDS`)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict
from typing import IO, Any

import numpy as np

from tui.experiment.ab_stats import as_json as ab_json
from tui.experiment.ab_stats import format_table as ab_table
from tui.model.streams import SUMMARY_GROUPS
from tui.recordings.codec import Tables
from tui.report.overlap_report import format_class_table
from tui.report.peaks import measured_lines, peaks_json, peaks_line
from tui.report.rows import LOOP_FIELDS, Report, Row
from tui.report.streams import group_names
from tui.report.table_text import aligned_table, fmt_bytes, fmt_num
from tui.report.views_text import group_table, job_line, missing_lines, step_table, stream_table
from workers.wire import protocol as p
from workers.wire.overlap import CLASS_KEYS, classify_columns

#: The columns of ``--format csv --records``, in order.
RECORD_FIELDS = (
    "rank",
    "iteration",
    "step",
    "epoch",
    "mode",
    "op",
    "group",
    "dtype",
    "nbytes",
    "host_ns",
    "start_ns",
    "dur_us",
    "algbw",
    "busbw",
    "recv_ns",
    "overlap",  # overlap class (workers.wire.overlap.CLASS_KEYS): during / after / none
    "overlapped",  # fraction of the collective's time a copy of its GPU ran
)


def _pair(a: float, b: float) -> str:
    if not (math.isfinite(a) or math.isfinite(b)):
        return "n/a"
    return f"{fmt_num(a)}/{fmt_num(b)}"


def window_note(report: Report) -> str:
    """ " (seconds 10-20 of the recording)" under ``--window``, else ""."""
    if report.window_s is None:
        return ""
    lo, hi = report.window_s
    return f" (seconds {round(lo, 1):g}-{round(hi, 1):g} after the first record, --window)"


def format_table(report: Report) -> str:
    meta = report.meta
    lines = [
        f"commtop report: {report.path}",
        f"  {report.records:,} collective records in {report.duration_s:.1f} s of recording{window_note(report)}; "
        f"ranks {len(meta.get('ranks') or [])} on {', '.join(meta.get('hosts') or ['?'])}; "
        f"commtop {meta.get('tool_version', '?')}, schema {meta.get('schema_version', '?')}",
    ]
    if report.job.is_job:
        lines.append(f"  {job_line(report)}")
    ended = report.ending.line([r.rank for r in report.ranks])
    if ended:
        lines.append(f"  {ended}")
    waits = report.ending.waits
    if waits:
        shown = [f"rank {r} inside {w}" for r, w in list(waits.items())[:SUMMARY_GROUPS]]
        more = f", +{len(waits) - SUMMARY_GROUPS} more" if len(waits) > SUMMARY_GROUPS else ""
        lines.append(f"  longest waits inside a collective: {'; '.join(shown)}{more}")
    if report.problems:
        lines.append(f"  warning: {report.problems}")
    if report.several_streams or not report.has_modes:
        lines += ["", *stream_table(report.rows, report.has_modes)]
    else:
        lines += _loop_table(report)
    if report.modes and report.has_modes:
        lines += ["", "per mode (all ranks)   n        p50 ms    p99 ms   slowdown vs none"]
        for m in report.modes:
            lines.append(
                f"  {m.mode:18} {m.count:>9}  {fmt_num(m.p50_us / 1e3, '{:.3f}'):>8}  {fmt_num(m.p99_us / 1e3, '{:.3f}'):>8}"
                f"   {fmt_num(m.slowdown, '{:.2f}x')}"
            )
    if not report.several_streams:  # several: the stream table has the classes' p50s
        lines += format_class_table(report.rows)
    for result in report.ab:
        lines += ["", *ab_table(result, report.peaks.copy_share(result.copy_gbps[1])).splitlines()]
    lines += step_table(report.steps)
    lines += group_table(report.groups)
    lines += missing_lines(report.ranks)
    lines.append("")
    lines += footnote(str(meta.get("backend") or ""))
    lines.append(peaks_line(report.peaks))
    lines += measured_lines(report.peaks, report.rows)
    return "\n".join(lines) + "\n"


def _loop_table(report: Report) -> list[str]:
    """The synthetic loop's table: per epoch its settings, then all ranks and each rank."""
    head = (
        "epoch",
        "mode",
        "copies",
        "size",
        "pin",
        "dir",
        "rank",
        "n",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "algbw",
        "busbw",
        "copy GB/s",
        "PCIe tx/rx",
        "NVLink tx/rx",
        "SM MHz",
        "power W",
        "slowdown",
    )
    body = []
    for r in report.rows:
        body.append(
            (
                str(r.epoch),
                r.mode,
                "-" if r.copies is None else fmt_num(r.copies, "{:g}"),
                fmt_bytes(r.copy_bytes),
                "-" if r.pinned is None else ("yes" if r.pinned else "no"),
                r.direction or "-",
                "all" if r.rank is None else str(r.rank),
                str(r.count),
                fmt_num(r.p50_us / 1e3, "{:.3f}"),
                fmt_num(r.p90_us / 1e3, "{:.3f}"),
                fmt_num(r.p99_us / 1e3, "{:.3f}"),
                fmt_num(r.max_us / 1e3, "{:.3f}"),
                fmt_num(r.algbw_gbps),
                fmt_num(r.busbw_gbps),
                fmt_num(r.copy_gbps),
                _pair(r.pcie_tx_gbps, r.pcie_rx_gbps),
                _pair(r.nvlink_tx_gbps, r.nvlink_rx_gbps),
                fmt_num(r.sm_clock_mhz, "{:.0f}"),
                fmt_num(r.power_w, "{:.0f}"),
                fmt_num(r.slowdown, "{:.2f}x"),
            )
        )
    return ["", *aligned_table(head, body, [r.epoch for r in report.rows], left={1, 5})]


def footnote(backend: str) -> list[str]:
    """How the numbers were measured: CUDA events on a GPU run, the host clock on gloo/CPU."""
    if backend.startswith("nccl") or "cuda" in backend:
        return [
            "latency = collective duration per rank (GPU time: CUPTI records, or CUDA events on the GPU); algbw/busbw GB/s as nccl-tests;",
            "PCIe/NVLink GB/s, SM clock and power = mean per GPU of the node telemetry during the epoch",
        ]
    return [
        f"latency = collective duration per rank (host clock around each call: {backend or 'no GPU'}); "
        "algbw/busbw GB/s as nccl-tests;",
        "no GPU: no PCIe/NVLink, clock or power telemetry (n/a)",
    ]


def json_clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_clean(v) for v in value]
    if isinstance(value, bytes):
        return None
    if isinstance(value, np.generic):
        return json_clean(value.item())
    return value


def row_fields(report: Report) -> list[str]:
    """The columns of a row in the CSV and JSON: every Row field, less the synthetic loop's
    settings, mode and slowdown where the run has no modes."""
    return [n for n in Row.__dataclass_fields__ if report.has_modes or n not in LOOP_FIELDS]


def format_json(report: Report) -> str:
    meta_keys = ("tool_version", "schema_version", "clock", "ranks", "world_size", "hosts", "gpus", "config", "backend")
    names = row_fields(report)
    doc = {
        "path": report.path,
        "complete": report.complete,
        "problems": report.problems,
        "duration_s": report.duration_s,
        "window_s": list(report.window_s) if report.window_s is not None else None,
        "records": report.records,
        "meta": {k: report.meta.get(k) for k in meta_keys},
        "job": asdict(report.job),
        "rows": [{n: v for n, v in asdict(r).items() if n in names} for r in report.rows],
        "modes": [asdict(m) for m in report.modes] if report.has_modes else [],
        "streams": [asdict(s) for s in report.streams],
        "steps": [asdict(s) for s in report.steps],
        "groups": [asdict(g) for g in report.groups],
        "ranks": [
            {
                **asdict(r),
                "missing": r.missing,
                "ended": report.ending.by_rank.get(r.rank),
                "longest_wait": report.ending.waits.get(r.rank),
            }
            for r in report.ranks
        ],
        "ended": report.ending.verdict or None,
        "first_failure": asdict(report.ending.first) if report.ending.first is not None else None,
        "restarts": report.ending.restarts,
        "first_failure_before_restart": (
            asdict(report.ending.before_restart) if report.ending.before_restart is not None else None
        ),
        "missing": sum(r.missing for r in report.ranks),
        "ab": [ab_json(result) for result in report.ab],
        "peaks": peaks_json(report.peaks),
    }
    return json.dumps(json_clean(doc), indent=1) + "\n"


def format_csv(report: Report) -> str:
    """One row per (epoch, rank or all, group, op, dtype, nbytes): :func:`row_fields`."""
    out = io.StringIO()
    names = row_fields(report)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for r in report.rows:
        values = asdict(r)
        # rank is empty on the all-ranks rows: one type per column (pandas reads it as a number)
        writer.writerow([_csv_value(values[n]) for n in names])
    return out.getvalue()


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


def write_records_csv(tables: Tables, out: IO[str], block: int = 100_000) -> int:
    """One row per collective record; floats with 9 significant digits (exact for float32)."""
    coll = tables.coll
    out.write(",".join(RECORD_FIELDS) + "\n")
    names = np.array(list(p.MODES) + ["?"] * (256 - len(p.MODES)), dtype=object)
    ops = np.array(list(p.OP_NAMES) + [f"op{i}" for i in range(len(p.OP_NAMES), 256)], dtype=object)
    dtypes = np.array(list(p.DTYPES) + [f"dtype{i}" for i in range(len(p.DTYPES), 256)], dtype=object)
    world = max((h.world_size for _, h in tables.hellos), default=0)
    named = group_names(coll["rank"], coll["group"], tables.hellos, world)  # by name, as the rows are
    groups = np.array([g[0] for g in named.groups] + ["?"], dtype=object)
    fmt = "%d,%d,%d,%d,%s,%s,%s,%s,%d,%d,%d,%.9g,%.9g,%.9g,%d,%s,%.4g\n"
    n = len(coll["dur_us"])
    ocls, ofrac = classify_columns(coll, tables.copy)
    classes = np.array(CLASS_KEYS, dtype=object)
    for a in range(0, n, block):
        s = slice(a, a + block)
        cols = (
            coll["rank"][s].tolist(),
            coll["iteration"][s].tolist(),
            coll["step"][s].tolist(),
            coll["epoch"][s].tolist(),
            names[coll["mode"][s]].tolist(),
            ops[coll["op"][s]].tolist(),
            groups[named.index[s]].tolist(),
            dtypes[coll["dtype"][s]].tolist(),
            coll["nbytes"][s].tolist(),
            coll["host_ns"][s].tolist(),
            coll["start_ns"][s].tolist(),
            coll["dur_us"][s].tolist(),
            coll["algbw"][s].tolist(),
            coll["busbw"][s].tolist(),
            coll["recv_ns"][s].tolist(),
            classes[ocls[s]].tolist(),
            ofrac[s].tolist(),
        )
        out.write("".join(fmt % row for row in zip(*cols, strict=True)))
    return n
