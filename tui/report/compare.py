"""`commtop report A B [C ...]`: recordings side by side, per offload mode, each against the first.

The question after a change (a driver, an NCCL version, a fix in the offload code, another
node) is "did the modes get faster or slower?". Each recording is summarised by
:func:`tui.report.compute.build_report`; this module only lines the per-mode numbers up, says which
run facts differ, and prints the ratios. Plain Python: no Textual, no torch.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tui.report.compute import Report, aligned_table, fmt_bytes, fmt_num, json_clean

#: Run facts printed per recording and checked for differences, in this order.
FACTS = ("backend", "world", "collective", "size", "dtype", "gpu", "hosts", "torch", "nccl")


@dataclass(frozen=True)
class ModeRun:
    """One offload mode in one recording (all ranks, every epoch in that mode)."""

    mode: str
    run: int  # index into the recordings compared; 0 is the reference
    count: int
    p50_us: float
    p99_us: float
    busbw_gbps: float  # record-weighted mean of the epochs in this mode
    copy_gbps: float  # copy-weighted mean
    p50_ratio: float  # p50 / the first recording's p50 of the same mode (NaN if it has none)
    p99_ratio: float
    during_p50_us: float = math.nan  # p50 per overlap class (during copies / after / no copies)
    after_p50_us: float = math.nan
    none_p50_us: float = math.nan


@dataclass(frozen=True)
class Comparison:
    reports: tuple[Report, ...]
    facts: tuple[dict[str, str], ...]
    differs: tuple[str, ...]  # names of FACTS that are not the same in every recording
    rows: tuple[ModeRun, ...]  # by mode (in protocol order), then run


def run_facts(report: Report) -> dict[str, str]:
    """What a recording measured, as short strings (``"?"`` when its metadata lacks it)."""
    meta = report.meta
    config = meta.get("config") or {}
    shape = config.get("shape") or []
    devices = sorted({str(g.get("device") or "") for g in meta.get("gpus") or [] if g.get("device")})
    return {
        "backend": str(meta.get("backend") or "?"),
        "world": str(meta.get("world_size") or len(meta.get("ranks") or []) or "?"),
        "collective": str(config.get("collective") or "?"),
        "size": "x".join(str(d) for d in shape) if shape else "?",
        "dtype": str(config.get("dtype") or "?"),
        "gpu": ", ".join(devices) or "?",
        "hosts": str(len(meta.get("hosts") or [])) or "?",
        "torch": str(meta.get("torch_version") or "?"),
        "nccl": str(meta.get("nccl_version") or "?"),
    }


def _weighted(pairs: Sequence[tuple[float, int]]) -> float:
    """Mean of per-epoch means weighted by their counts, over the finite ones."""
    ok = [(v, n) for v, n in pairs if n > 0 and math.isfinite(v)]
    total = sum(n for _, n in ok)
    return sum(v * n for v, n in ok) / total if total else math.nan


def compare(reports: Sequence[Report]) -> Comparison:
    """Per mode and recording: counts, p50/p99, busbw and copy GB/s, and ratios to the first."""
    facts = tuple(run_facts(r) for r in reports)
    differs = tuple(name for name in FACTS if len({f[name] for f in facts}) > 1)
    order: list[str] = []
    for report in reports:
        order += [m.mode for m in report.modes if m.mode not in order]
    reference = {m.mode: m for m in reports[0].modes} if reports else {}
    rows = []
    for mode in order:
        for i, report in enumerate(reports):
            m = next((x for x in report.modes if x.mode == mode), None)
            if m is None:
                continue
            epochs = [r for r in report.rows if r.rank is None and r.mode == mode]
            ref = reference.get(mode)
            rows.append(
                ModeRun(
                    mode=mode,
                    run=i,
                    count=m.count,
                    p50_us=m.p50_us,
                    p99_us=m.p99_us,
                    busbw_gbps=_weighted([(r.busbw_gbps, r.count) for r in epochs]),
                    copy_gbps=_weighted([(r.copy_gbps, r.copy_count) for r in epochs]),
                    p50_ratio=m.p50_us / ref.p50_us if ref is not None and ref.p50_us > 0 else math.nan,
                    p99_ratio=m.p99_us / ref.p99_us if ref is not None and ref.p99_us > 0 else math.nan,
                    during_p50_us=m.during_p50_us,
                    after_p50_us=m.after_p50_us,
                    none_p50_us=m.none_p50_us,
                )
            )
    return Comparison(tuple(reports), facts, differs, tuple(rows))


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"#{i + 1}"


def format_table(cmp: Comparison) -> str:
    lines = [f"commtop report: {len(cmp.reports)} recordings compared, each against A"]
    for i, (report, facts) in enumerate(zip(cmp.reports, cmp.facts, strict=True)):
        what = (
            f"{facts['backend']} · world {facts['world']} · {facts['collective']} {facts['size']} {facts['dtype']}"
            f" · {facts['gpu']} · torch {facts['torch']} · nccl {facts['nccl']}"
        )
        lines.append(f"  {_label(i)}  {report.path}")
        lines.append(f"     {what} · {report.records:,} records over {report.duration_s:.1f} s")
        if report.problems:
            lines.append(f"     warning: {report.problems}")
    if cmp.differs:
        lines.append(
            "  differs: " + "; ".join(f"{name} " + " | ".join(f[name] for f in cmp.facts) for name in cmp.differs)
        )
    else:
        lines.append("  same backend, world, collective, size, dtype, GPU, torch and NCCL")
    head = (
        "mode",
        "run",
        "n",
        "p50 ms",
        "p99 ms",
        "busbw",
        "copy GB/s",
        "p50 during/after/no copies",
        "p50 vs A",
        "p99 vs A",
    )
    body = [
        (
            row.mode,
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
        )
        for row in cmp.rows
    ]
    lines += ["", *aligned_table(head, body, [row.mode for row in cmp.rows], left={0, 1})]
    sizes = sorted({r.copy_bytes for rep in cmp.reports for r in rep.rows if r.copy_bytes})
    lines += [
        "",
        "p50/p99 = collective latency over all ranks of the mode; ratios > 1 mean slower than A."
        + (f" Copy sizes seen: {', '.join(fmt_bytes(s) for s in sizes)}." if sizes else ""),
    ]
    return "\n".join(lines) + "\n"


def format_json(cmp: Comparison) -> str:
    doc = {
        "recordings": [
            {"label": _label(i), "path": r.path, "complete": r.complete, "records": r.records, "facts": f}
            for i, (r, f) in enumerate(zip(cmp.reports, cmp.facts, strict=True))
        ],
        "differs": list(cmp.differs),
        "modes": [{**asdict(row), "label": _label(row.run)} for row in cmp.rows],
    }
    return json.dumps(json_clean(doc), indent=1) + "\n"


def format_csv(cmp: Comparison) -> str:
    out = io.StringIO()
    fields = ["mode", "label", "path", *(f.name for f in ModeRun.__dataclass_fields__.values() if f.name != "mode")]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in cmp.rows:
        values: dict[str, Any] = asdict(row)
        values.update(label=_label(row.run), path=cmp.reports[row.run].path)
        writer.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()})
    return out.getvalue()
