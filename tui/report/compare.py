"""`commtop report A B [C ...]`: recordings side by side, each against the first.

The question after a change (a driver, an NCCL version, a fix in the offload code, another
node) is "did the modes get faster or slower?"; for a user's job "did each stream (process
group, op, dtype, size) get faster or slower?". Recordings of jobs, or of several streams, are
compared per stream (all ranks and epochs, :class:`tui.report.rows.StreamRow`); the synthetic
loop's per settings. Settings rows are grouped by the full settings (mode,
copies, copy size, host memory, direction, knobs), not by mode alone: sync with 5 pinned D2H
copies and sync with 6 pageable H2D copies are different experiments. Each recording is
summarised by :func:`tui.report.build.build_report`; this module lines the rows up, says
which run facts differ and, per row, which settings differ from the row of A it is compared
with, and prints the ratios. Plain Python: no Textual, no torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tui.report.rows import Report, SettingsKey, SettingsRow, StreamRow
from tui.report.table_text import aligned_table, fmt_bytes, fmt_num
from tui.report.text import json_clean, window_note
from tui.report.views_text import size_cell
from workers.wire.protocol import MODES

#: Run facts printed per recording and checked for differences, in this order.
FACTS = ("backend", "world", "collective", "size", "dtype", "gpu", "hosts", "torch", "nccl")


@dataclass(frozen=True)
class ModeRun:
    """One set of settings (mode, copies, copy size, host memory, direction, knobs) in one
    recording: all ranks, every epoch that ran with exactly those settings."""

    mode: str
    settings: str  # the rest of the settings, e.g. "5 copies x 1MiB, pinned, d2h"
    run: int  # index into the recordings compared; 0 is the reference
    count: int
    p50_us: float
    p99_us: float
    busbw_gbps: float  # record-weighted mean of the epochs with these settings
    copy_gbps: float  # copy-weighted mean
    p50_ratio: float  # p50 / p50 of A's row it is compared with (NaN when A has none of that mode)
    p99_ratio: float
    versus: str  # what differs from that row of A: "" (the same settings), "copies 6 (A 5), h2d (A d2h)"
    during_p50_us: float = math.nan  # p50 per overlap class (during copies / after / no copies)
    after_p50_us: float = math.nan
    none_p50_us: float = math.nan


@dataclass(frozen=True)
class StreamRun:
    """One stream (group, op, dtype, size) in one recording, all ranks and epochs."""

    group: str  # "0:default_pg"
    op: str
    dtype: str
    nbytes: int
    run: int
    count: int
    p50_us: float
    p99_us: float
    busbw_gbps: float
    step_share: float  # of the ranks' time
    p50_ratio: float  # p50 / A's p50 of the same stream (NaN: A has none)
    p99_ratio: float


@dataclass(frozen=True)
class Comparison:
    reports: tuple[Report, ...]
    facts: tuple[dict[str, str], ...]
    differs: tuple[str, ...]  # names of FACTS that are not the same in every recording
    rows: tuple[ModeRun, ...]  # by mode (in protocol order), then settings, then run
    #: Per stream (by group, op, dtype, size, then run) where any recording is a job or runs
    #: several streams; empty otherwise.
    streams: tuple[StreamRun, ...] = ()


def run_facts(report: Report) -> dict[str, str]:
    """What a recording measured, as short strings (``"?"`` when its metadata lacks it)."""
    meta = report.meta
    config = meta.get("config") or {}
    shape = config.get("shape") or []
    devices = sorted({str(g.get("device") or "") for g in meta.get("gpus") or [] if g.get("device")})
    job = report.job.is_job  # a user's job: its script, no synthetic tensor
    return {
        "backend": str(meta.get("backend") or "?"),
        "world": str(meta.get("world_size") or len(meta.get("ranks") or []) or "?"),
        "collective": f"job {report.job.script}" if job else str(config.get("collective") or "?"),
        "size": "" if job else "x".join(str(d) for d in shape) if shape else "?",
        "dtype": "" if job else str(config.get("dtype") or "?"),
        "gpu": ", ".join(devices) or "?",
        "hosts": str(len(meta.get("hosts") or [])) or "?",
        "torch": str(meta.get("torch_version") or "?"),
        "nccl": _nccl(meta),
    }


def _nccl(meta: dict[str, Any]) -> str:
    """The NCCL version; what the run had instead when it ran gloo ("gloo, no NCCL")."""
    if meta.get("nccl_version"):
        return str(meta["nccl_version"])
    backend = str(meta.get("backend") or "")
    return f"{backend.split('/')[0]}, no NCCL" if backend and not backend.startswith("nccl") else "?"


def settings_label(key: SettingsKey) -> str:
    """The settings beside the mode, short: "5 copies x 1MiB, pinned, d2h" ("-" in mode none
    with no copies, where they say nothing)."""
    parts = []
    if key.copies is not None:
        size = f" x {fmt_bytes(key.copy_bytes)}" if key.copy_bytes else ""
        parts.append(f"{key.copies:g} copies{size}")
    if key.pinned is not None:
        parts.append("pinned" if key.pinned else "pageable")
    if key.direction:
        parts.append(key.direction)
    if key.knobs:
        parts.append(key.knobs)
    return ", ".join(parts) or "-"


def _differences(key: SettingsKey, ref: SettingsKey) -> str:
    """What ``key`` changes against A's ``ref`` (same mode), e.g. "copies 6 (A 5), h2d (A d2h)"."""
    out = []
    if key.copies != ref.copies:
        out.append(f"copies {_opt(key.copies)} (A {_opt(ref.copies)})")
    if key.copy_bytes != ref.copy_bytes:
        out.append(f"size {fmt_bytes(key.copy_bytes)} (A {fmt_bytes(ref.copy_bytes)})")
    if key.pinned != ref.pinned:
        out.append(f"{_memory(key.pinned)} (A {_memory(ref.pinned)})")
    if key.direction != ref.direction:
        out.append(f"{key.direction or '-'} (A {ref.direction or '-'})")
    if key.knobs != ref.knobs:
        out.append(f"{key.knobs or 'no knobs'} (A {ref.knobs or 'no knobs'})")
    return ", ".join(out)


def _opt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _memory(pinned: bool | None) -> str:
    return "-" if pinned is None else ("pinned" if pinned else "pageable")


def _reference(key: SettingsKey, reference: Sequence[SettingsRow]) -> SettingsRow | None:
    """A's row with the same settings, else A's row of the same mode with the most records."""
    same = [r for r in reference if r.key == key]
    if same:
        return same[0]
    mode = [r for r in reference if r.key.mode == key.mode]
    return max(mode, key=lambda r: r.count) if mode else None


def compare(reports: Sequence[Report]) -> Comparison:
    """Per settings and recording: counts, p50/p99, busbw and copy GB/s, and ratios to A's
    row with the same settings (else A's main row of the same mode, saying what differs)."""
    facts = tuple(run_facts(r) for r in reports)
    differs = tuple(name for name in FACTS if len({f[name] for f in facts}) > 1)
    keys: list[SettingsKey] = []
    for report in reports:
        keys += [row.key for row in report.settings if row.key not in keys]
    mode_rank = {m: i for i, m in enumerate(MODES)}
    keys.sort(key=lambda k: mode_rank.get(k.mode, len(MODES)))  # stable: first seen first within a mode
    reference = reports[0].settings if reports else ()
    rows = []
    for key in keys:
        for i, report in enumerate(reports):
            mine = next((x for x in report.settings if x.key == key), None)
            if mine is None:
                continue
            ref = _reference(key, reference)
            rows.append(
                ModeRun(
                    mode=key.mode,
                    settings=settings_label(key),
                    run=i,
                    count=mine.count,
                    p50_us=mine.p50_us,
                    p99_us=mine.p99_us,
                    busbw_gbps=mine.busbw_gbps,
                    copy_gbps=mine.copy_gbps,
                    p50_ratio=mine.p50_us / ref.p50_us if ref is not None and ref.p50_us > 0 else math.nan,
                    p99_ratio=mine.p99_us / ref.p99_us if ref is not None and ref.p99_us > 0 else math.nan,
                    versus="" if ref is None or i == 0 else _differences(key, ref.key),
                    during_p50_us=mine.during_p50_us,
                    after_p50_us=mine.after_p50_us,
                    none_p50_us=mine.none_p50_us,
                )
            )
    by_stream = any(r.job.is_job or r.several_streams for r in reports)
    return Comparison(tuple(reports), facts, differs, tuple(rows), tuple(_stream_runs(reports)) if by_stream else ())


def _stream_runs(reports: Sequence[Report]) -> list[StreamRun]:
    """Per stream (in the order of the first recording that has it) and recording, against A."""
    keys: list[tuple[str, str, str, int]] = []
    for report in reports:
        keys += [s.key for s in report.streams if s.key not in keys]
    keys.sort(key=lambda k: (not k[0].isdigit(), int(k[0]) if k[0].isdigit() else 0, k))
    ref = {s.key: s for s in reports[0].streams} if reports else {}
    out = []
    for key in keys:
        a = ref.get(key)
        for i, report in enumerate(reports):
            mine: StreamRow | None = next((s for s in report.streams if s.key == key), None)
            if mine is None:
                continue
            out.append(
                StreamRun(
                    group=mine.group_text,
                    op=mine.op,
                    dtype=mine.dtype,
                    nbytes=mine.nbytes,
                    run=i,
                    count=mine.count,
                    p50_us=mine.p50_us,
                    p99_us=mine.p99_us,
                    busbw_gbps=mine.busbw_gbps,
                    step_share=mine.step_share,
                    p50_ratio=mine.p50_us / a.p50_us if a is not None and a.p50_us > 0 else math.nan,
                    p99_ratio=mine.p99_us / a.p99_us if a is not None and a.p99_us > 0 else math.nan,
                )
            )
    return out


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"#{i + 1}"


def format_table(cmp: Comparison) -> str:
    lines = [f"commtop report: {len(cmp.reports)} recordings compared, each against A"]
    for i, (report, facts) in enumerate(zip(cmp.reports, cmp.facts, strict=True)):
        workload = " ".join(w for w in (facts["collective"], facts["size"], facts["dtype"]) if w)
        what = (
            f"{facts['backend']} · world {facts['world']} · {workload}"
            f" · {facts['gpu']} · torch {facts['torch']} · "
            + (f"nccl {facts['nccl']}" if "NCCL" not in facts["nccl"] else "no NCCL")
        )
        lines.append(f"  {_label(i)}  {report.path}")
        lines.append(
            f"     {what} · {report.records:,} records in {report.duration_s:.1f} s of recording{window_note(report)}"
        )
        if report.problems:
            lines.append(f"     warning: {report.problems}")
    if cmp.differs:
        lines.append(
            "  differs: " + "; ".join(f"{name} " + " | ".join(f[name] for f in cmp.facts) for name in cmp.differs)
        )
    else:
        lines.append("  same backend, world, collective, size, dtype, GPU, torch and NCCL")
    if cmp.streams:
        lines += ["", *_stream_table(cmp.streams)]
    if all(r.has_modes for r in cmp.reports):
        lines += _mode_table(cmp)
    return "\n".join(lines) + "\n"


def _stream_table(streams: Sequence[StreamRun]) -> list[str]:
    head = ("group", "op", "dtype", "size", "run", "n", "p50 ms", "p99 ms", "busbw", "share", "p50 vs A", "p99 vs A")
    body = [
        (
            s.group,
            s.op,
            s.dtype,
            size_cell(s.nbytes),
            _label(s.run),
            f"{s.count:,}",
            fmt_num(s.p50_us / 1e3, "{:.3f}"),
            fmt_num(s.p99_us / 1e3, "{:.3f}"),
            fmt_num(s.busbw_gbps, "{:.2f}"),
            fmt_num(s.step_share * 100, "{:.1f} %"),
            "-" if s.run == 0 else fmt_num(s.p50_ratio, "{:.2f}x").replace("n/a", "no A"),
            "-" if s.run == 0 else fmt_num(s.p99_ratio, "{:.2f}x").replace("n/a", "no A"),
        )
        for s in streams
    ]
    groups = [(s.group, s.op, s.dtype, s.nbytes) for s in streams]
    return [
        "per stream (all ranks and epochs): ratios > 1 mean slower than A's same stream",
        *(line.rstrip() for line in aligned_table(head, body, groups, left={0, 1, 2, 4})),
    ]


def _mode_table(cmp: Comparison) -> list[str]:
    lines = []
    head = (
        "mode",
        "settings",
        "run",
        "n",
        "p50 ms",
        "p99 ms",
        "busbw",
        "copy GB/s",
        "p50 during/after/no copies",
        "p50 vs A",
        "p99 vs A",
        "vs A",
    )
    body = [
        (
            row.mode,
            row.settings,
            _label(row.run),
            f"{row.count:,}",
            fmt_num(row.p50_us / 1e3, "{:.3f}"),
            fmt_num(row.p99_us / 1e3, "{:.3f}"),
            fmt_num(row.busbw_gbps),
            fmt_num(row.copy_gbps),
            "/".join(
                fmt_num(v / 1e3, "{:.3f}").replace("n/a", "-")
                for v in (row.during_p50_us, row.after_p50_us, row.none_p50_us)
            ),
            "-" if row.run == 0 else fmt_num(row.p50_ratio, "{:.2f}x"),
            "-" if row.run == 0 else fmt_num(row.p99_ratio, "{:.2f}x"),
            "-" if row.run == 0 else (row.versus or "same settings") if math.isfinite(row.p50_ratio) else "no A",
        )
        for row in cmp.rows
    ]
    groups = [f"{row.mode} {row.settings}" for row in cmp.rows]
    lines += ["", *(line.rstrip() for line in aligned_table(head, body, groups, left={0, 1, 2, 10}))]
    sizes = sorted({r.copy_bytes for rep in cmp.reports for r in rep.rows if r.copy_bytes})
    lines += [
        "",
        "p50/p99 = collective latency over all ranks and epochs with those settings; ratios > 1 mean slower "
        "than A's row with the same settings (or, where A has none, A's main row of that mode: 'vs A' says "
        "what differs)." + (f" Copy sizes seen: {', '.join(fmt_bytes(s) for s in sizes)}." if sizes else ""),
    ]
    return lines


def format_json(cmp: Comparison) -> str:
    doc = {
        "recordings": [
            {"label": _label(i), "path": r.path, "complete": r.complete, "records": r.records, "facts": f}
            for i, (r, f) in enumerate(zip(cmp.reports, cmp.facts, strict=True))
        ],
        "differs": list(cmp.differs),
        "modes": [{**asdict(row), "label": _label(row.run)} for row in cmp.rows],
        "streams": [{**asdict(row), "label": _label(row.run)} for row in cmp.streams],
    }
    return json.dumps(json_clean(doc), indent=1) + "\n"


def format_csv(cmp: Comparison) -> str:
    """One row per mode/settings and recording; per stream and recording where the recordings
    are compared by stream."""
    if cmp.streams:
        return _streams_csv(cmp)
    out = io.StringIO()
    fields = ["mode", "label", "path", *(f.name for f in ModeRun.__dataclass_fields__.values() if f.name != "mode")]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in cmp.rows:
        values: dict[str, Any] = asdict(row)
        values.update(label=_label(row.run), path=cmp.reports[row.run].path)
        writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()})
    return out.getvalue()


def _streams_csv(cmp: Comparison) -> str:
    out = io.StringIO()
    fields = ["label", "path", *StreamRun.__dataclass_fields__]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in cmp.streams:
        values: dict[str, Any] = asdict(row)
        values.update(label=_label(row.run), path=cmp.reports[row.run].path)
        writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()})
    return out.getvalue()
