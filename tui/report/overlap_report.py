"""Overlap classes in `commtop report`: per epoch and rank, n / p50 / p99 of the collectives
that ran during copies (with the overlapped fraction), after their step's copies, and in
steps without copies. The labels come from workers.wire.overlap, the one classifier the live
model and `commtop ab` use too."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tui.experiment.ab_stats import ABResult, analyse, blocks_from_marks
from tui.recordings.codec import Tables
from tui.report.rows import Row
from tui.report.table_text import aligned_table, fmt_num
from workers.wire.overlap import AFTER, CLASS_KEYS, CLASSES, DURING, NO_COPIES
from workers.wire.stats import percentile, percentiles, percentiles_and_max_sorted

#: Flat fields added to every report row (json and csv get one column each).
_ORDER = ((DURING, "during"), (AFTER, "after"), (NO_COPIES, "none"))


def _p(values: np.ndarray, q: float) -> float:
    return percentile(values, q)


def class_fields(
    dur_us: np.ndarray, cls: np.ndarray, frac: np.ndarray, sorted_by_class: dict[int, np.ndarray] | None = None
) -> dict[str, Any]:
    """{during_n, during_p50_us, during_p99_us, during_overlap, after_n, ..., none_p99_us};
    ``sorted_by_class``: each class's durations already sorted (then nothing is sorted here)."""
    out: dict[str, Any] = {}
    for c, key in _ORDER:
        sel = cls == c
        d = sorted_by_class[c] if sorted_by_class is not None else dur_us[sel]
        out[f"{key}_n"] = int(len(d))
        if sorted_by_class is not None:
            out[f"{key}_p50_us"], out[f"{key}_p99_us"] = percentiles_and_max_sorted(d, (50, 99))[0]
        else:
            out[f"{key}_p50_us"], out[f"{key}_p99_us"] = percentiles(d, (50, 99))  # one sort, not two
        if c == DURING:
            out["during_overlap"] = float(frac[sel].mean()) if len(d) else math.nan
    return out


def class_p50s(dur_us: np.ndarray, cls: np.ndarray) -> tuple[float, float, float]:
    """p50 of the collectives during copies, after copies, with no copies (NaN where none)."""
    return (_p(dur_us[cls == DURING], 50), _p(dur_us[cls == AFTER], 50), _p(dur_us[cls == NO_COPIES], 50))


def format_class_table(rows: Sequence[Row]) -> list[str]:
    """Lines of the per-class section of the report table."""
    head = ("epoch", "mode", "rank", "class", "n", "p50 ms", "p99 ms", "overlapped")
    body: list[tuple[str, ...]] = []
    keys: list[int] = []
    for r in rows:
        for c, key in _ORDER:
            n = getattr(r, f"{key}_n", 0)
            if not n:
                continue
            body.append(
                (
                    str(r.epoch),
                    r.mode,
                    "all" if r.rank is None else str(r.rank),
                    CLASSES[c],
                    str(n),
                    fmt_num(getattr(r, f"{key}_p50_us") / 1e3, "{:.3f}"),
                    fmt_num(getattr(r, f"{key}_p99_us") / 1e3, "{:.3f}"),
                    fmt_num(r.during_overlap * 100, "{:.0f} %") if c == DURING else "",
                )
            )
            keys.append(r.epoch)
    if not body:
        return []
    return [
        "",
        "per overlap class (during copies: overlapped by a copy of the same GPU, with the mean overlapped fraction;",
        "after copies: its step's copies had all finished; no copies: neither)",
        *aligned_table(head, body, keys, left={1, 3}),
    ]


def ab_sections(
    tables: Tables,
    cls: np.ndarray,
    frac: np.ndarray,
    link: Callable[[int, int], float] | None = None,
    hbm: Callable[[int, int], float] | None = None,
    epoch_starts: dict[int, tuple[int, int]] | None = None,
) -> list[ABResult]:
    """The A/B experiments recorded in ``tables`` (their marks), re-analysed from the records.
    ``link(t0, t1)``: link tx GB/s over a time window, ``hbm(t0, t1)``: HBM bandwidth
    utilisation % (GPM), each averaged per arm over its blocks' (first start, last start) of
    collectives: from ``epoch_starts`` per epoch where given, else from the start_ns column."""
    out = []
    coll = {"epoch": tables.coll["epoch"], "dur_us": tables.coll["dur_us"], "cls": cls, "frac": frac}
    for start, blocks in blocks_from_marks(tables.other):
        a, b = str(start.get("a", "A")), str(start.get("b", "B"))
        out.append(
            analyse(
                blocks,
                coll,
                tables.copy,
                a=a,
                b=b,
                link_gbps=_per_arm(tables, blocks, link, epoch_starts),
                hbm_util_pct=_per_arm(tables, blocks, hbm, epoch_starts),
                seconds=float(start.get("seconds", 0.0)),
            )
        )
    return out


def _per_arm(
    tables: Tables,
    blocks: list[Any],
    value: Callable[[int, int], float] | None,
    epoch_starts: dict[int, tuple[int, int]] | None = None,
) -> tuple[float, float]:
    """Per arm, the mean over its blocks of ``value`` over each block's collective window."""
    if value is None or not blocks:
        return (math.nan, math.nan)
    if epoch_starts is None:
        epochs = np.asarray(tables.coll["epoch"])
        starts = np.asarray(tables.coll["start_ns"])
        epoch_starts = {}
        for ep in {blk.epoch for blk in blocks}:
            sel = epochs == ep
            if sel.any():
                epoch_starts[ep] = (int(starts[sel].min()), int(starts[sel].max()))
    per_arm: dict[str, list[float]] = {"A": [], "B": []}
    for blk in blocks:
        if blk.epoch in epoch_starts:
            per_arm[blk.arm].append(value(*epoch_starts[blk.epoch]))
    a_vals = [v for v in per_arm["A"] if math.isfinite(v)]
    b_vals = [v for v in per_arm["B"] if math.isfinite(v)]
    return (
        sum(a_vals) / len(a_vals) if a_vals else math.nan,
        sum(b_vals) / len(b_vals) if b_vals else math.nan,
    )


__all__ = ["CLASS_KEYS", "ab_sections", "class_fields", "class_p50s", "format_class_table"]
