"""What `commtop report` reads of a recording: the collective columns it needs (fewer where
the writer summarised its chunks), and the cut to a time window (``--window``)."""

from __future__ import annotations

import math

import numpy as np

from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.report.kernels import _group

#: The stream (group, op, dtype, nbytes), the step view (step, start_ns) and the gaps (iteration)
#: need their columns; the rows their durations and sums.
REPORT_COLUMNS = (
    "iteration",
    "epoch",
    "step",
    "mode",
    "op",
    "group",
    "dtype",
    "nbytes",
    "start_ns",
    "dur_us",
    "algbw",
    "busbw",
)


def report_columns(rec: Recording) -> tuple[str, ...]:
    """The collective columns the report reads from ``rec``: :data:`REPORT_COLUMNS`."""
    return REPORT_COLUMNS


#: Columns a report reads at a few records only (a rank's first and last iteration): left
#: encoded where the reader can (``Tables.coll_values``).
SPARSE_COLUMNS = ("iteration",)


def summary_columns(rec: Recording) -> tuple[str, ...]:
    """The collective columns a report reads where the chunks carry summaries: those of
    :func:`report_columns` less algbw and busbw (summed in the summaries) and the
    :data:`SPARSE_COLUMNS`."""
    return tuple(c for c in report_columns(rec) if c not in ("algbw", "busbw", *SPARSE_COLUMNS))


def report_tables(rec: Recording) -> Tables:
    """The tables :func:`build_report` needs: fewer columns and the summaries where the writer
    summarised its chunks (tui.recordings.summary), else the report's columns; the records
    grouped by (epoch, rank) while the other columns decode."""
    if rec.has_summaries:
        return rec.tables(coll_columns=summary_columns(rec), summary=True, group_by=_group, sparse=SPARSE_COLUMNS)
    return rec.tables(coll_columns=report_columns(rec), group_by=_group)


def window_span(window: tuple[float, float], duration_s: float) -> tuple[float, float]:
    """``window`` (seconds after the first record) within a recording ``duration_s`` long."""
    lo = min(max(window[0], 0.0), duration_s)
    return lo, min(max(window[1], lo), duration_s)


def window_tables(tables: Tables, window: tuple[float, float]) -> Tables:
    """Only what starts ``window`` seconds after the first record (telemetry by its tick time)."""
    starts = [t["start_ns"].min() for t in (tables.coll, tables.copy) if len(t["start_ns"])]
    if not starts:
        return tables
    base = int(min(starts))
    lo = base + window[0] * 1e9
    hi = base + window[1] * 1e9 if math.isfinite(window[1]) else math.inf

    def cut(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keep = (table["start_ns"] >= lo) & (table["start_ns"] <= hi)
        return {name: col[keep] for name, col in table.items()}

    ticks = [(t, tick) for t, tick in tables.ticks if lo <= tick.t_ns <= hi]
    return Tables(cut(tables.coll), cut(tables.copy), tables.hellos, tables.byes, ticks, tables.other)
