"""The views of a job in the headless summary: the header of a user's job (its script, steps/s,
groups and ops instead of the synthetic loop's tensor), the step line, and one line per stream
(group, op, dtype, bytes, count, p50, p99, busbw) after the per-rank table."""

from __future__ import annotations

import math

from tui.model.snapshot import Snapshot
from tui.model.streams import OTHER, SUMMARY_GROUPS, StreamView, groups_and_ops, listed

#: The first line of the stream block (tests find the block by it).
STREAMS_TITLE = "streams (all ranks):"


def _ms(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3f}" if value < 10 else f"{value:.2f}"


def job_workload(s: Snapshot) -> str:
    """ "job train.py (python hooks) · 222.2 steps/s · groups 0:default_pg (4), 1 (2) · ops all_reduce, broadcast"."""
    job = s.job
    what = f"job {job.script}" + (f" ({job.capture})" if job.capture else "")
    parts = [what]
    if math.isfinite(s.steps.steps_per_s):
        parts.append(f"{s.steps.steps_per_s:,.1f} steps/s")
    groups, ops = groups_and_ops(s.streams)
    if groups:
        parts.append("groups " + listed(groups, SUMMARY_GROUPS))
    if ops:
        parts.append("ops " + ", ".join(ops))
    return " · ".join(parts)


def stream_lines(streams: tuple[StreamView, ...]) -> list[str]:
    """The stream block: title, header, rule, one line per stream ("other" last)."""
    if not streams:
        return []
    cols = ("group", "op", "dtype", "bytes", "count", "p50 ms", "p99 ms", "busbw GB/s")
    rows = [_row(s) for s in streams]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    return ["", STREAMS_TITLE, fmt(cols), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def _row(s: StreamView) -> tuple[str, ...]:
    approx = "" if s.exact else "~"
    other = s.index == OTHER
    return (
        s.group_text,
        s.op,
        s.dtype or "-",
        "-" if other else str(s.nbytes),
        str(s.count),
        approx + _ms(s.p50_ms),
        approx + _ms(s.p99_ms),
        "-" if not math.isfinite(s.busbw_gbps) else f"{s.busbw_gbps:.2f}",
    )
