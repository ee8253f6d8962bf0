"""The overlap class of every collective: did it run while a copy ran, after its step's
copies, or in a step without copies?

The forum's author saw three numbers: an all_gather alone (2.7 ms), while D2H copies ran
(13 ms), and after they finished (4.4 ms). This module labels each collective record with
the class it belongs to, from the GPU timestamps the records already carry, so every table
can show the three side by side.

Rules (one rank, i.e. one GPU; copies of other ranks never count):

* **during copies**: the collective's interval ``[start, end)`` overlaps the union of the
  rank's copy intervals by more than zero time (touching ends do not overlap). The
  overlapped fraction is (overlapped time) / (collective duration); a zero-length
  collective strictly inside a copy counts as during, fraction 1.
* **after copies**: not during, and its step had copies which all ended at or before the
  collective started.
* **no copies**: everything else (its step had no copies, or they had not started yet).

Torch-free, numpy only, vectorised: a batch costs a fixed number of numpy calls.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NO_COPIES, DURING, AFTER = 0, 1, 2
#: Names by class index, as tables and JSON spell them.
CLASSES: tuple[str, ...] = ("no copies", "during copies", "after copies")
#: Short names for column headers and CSV.
CLASS_KEYS: tuple[str, ...] = ("none", "during", "after")


def copy_union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge copy intervals into disjoint, sorted segments: (starts, ends, covered time before
    each segment). Overlapping or touching copies merge into one segment."""
    if len(start) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    s = np.asarray(start, dtype=np.int64)
    e = np.asarray(end, dtype=np.int64)
    if len(s) > 1 and bool((s[1:] < s[:-1]).any()):  # copies usually arrive in start order: no sort
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    e = np.maximum(e, s)
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    firsts = np.flatnonzero(new)
    lasts = np.empty_like(firsts)
    lasts[:-1] = firsts[1:] - 1
    lasts[-1] = len(s) - 1
    seg_s, seg_e = s[firsts], reach[lasts]
    before = np.zeros(len(seg_s), dtype=np.int64)
    np.cumsum((seg_e - seg_s)[:-1], out=before[1:])
    return seg_s, seg_e, before


def _covered(t: np.ndarray, seg_s: np.ndarray, seg_e: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Copy time covered in (-inf, t] for each t."""
    i = np.searchsorted(seg_s, t, side="right") - 1
    has = i >= 0
    j = np.maximum(i, 0)
    part = np.maximum(np.minimum(t, seg_e[j]) - seg_s[j], 0)
    return np.where(has, before[j] + part, 0)


def _last_end_per_step(step: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct steps ascending, the latest copy end of each)."""
    if len(step) > 1 and bool((step[1:] < step[:-1]).any()):
        order = np.argsort(step, kind="stable")
        step, end = step[order], end[order]
    first = np.flatnonzero(np.concatenate(([True], step[1:] != step[:-1])))
    return step[first], np.maximum.reduceat(end, first)


def classify(
    coll_start: np.ndarray,
    coll_end: np.ndarray,
    coll_step: np.ndarray,
    copy_start: np.ndarray,
    copy_end: np.ndarray,
    copy_step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(class per collective as uint8, overlapped fraction as float32) for one rank.

    Times are ns on one clock (the records' ``start_ns`` and ``start_ns + dur``)."""
    n = len(coll_start)
    cls = np.zeros(n, dtype=np.uint8)
    frac = np.zeros(n, dtype=np.float32)
    if n == 0 or len(copy_start) == 0:
        return cls, frac
    a = np.asarray(coll_start, dtype=np.int64)
    b = np.maximum(np.asarray(coll_end, dtype=np.int64), a)
    seg_s, seg_e, before = copy_union(copy_start, copy_end)
    overlap = _covered(b, seg_s, seg_e, before) - _covered(a, seg_s, seg_e, before)
    length = b - a
    during = overlap > 0
    point = length == 0
    if point.any():  # a zero-length collective strictly inside a copy segment
        i = np.maximum(np.searchsorted(seg_s, a, side="left") - 1, 0)
        inside = point & (seg_s[i] < a) & (a < seg_e[i])
        during |= inside
        frac[inside] = 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(length > 0, overlap / np.maximum(length, 1), frac).astype(np.float32)
    cls[during] = DURING
    # after: the step had copies, all ended by the collective's start
    steps, last_end = _last_end_per_step(np.asarray(copy_step, dtype=np.int64), np.asarray(copy_end, dtype=np.int64))
    cs = np.asarray(coll_step, dtype=np.int64)
    pos = np.minimum(np.searchsorted(steps, cs), len(steps) - 1)
    had = steps[pos] == cs
    after = ~during & had & (last_end[pos] <= a)
    cls[after] = AFTER
    return cls, frac


def classify_ranks(
    coll_rank: np.ndarray,
    coll_start: np.ndarray,
    coll_end: np.ndarray,
    coll_step: np.ndarray,
    copy_rank: np.ndarray,
    copy_start: np.ndarray,
    copy_end: np.ndarray,
    copy_step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`classify` for records of many ranks: each rank only against its own copies."""
    n = len(coll_rank)
    cls = np.zeros(n, dtype=np.uint8)
    frac = np.zeros(n, dtype=np.float32)
    if n == 0 or len(copy_rank) == 0:
        return cls, frac
    c_order = np.argsort(coll_rank, kind="stable")
    p_order = np.argsort(copy_rank, kind="stable")
    c_ranks, c_first = np.unique(np.asarray(coll_rank)[c_order], return_index=True)
    p_ranks, p_first = np.unique(np.asarray(copy_rank)[p_order], return_index=True)
    c_bounds = np.append(c_first, n)
    p_bounds = np.append(p_first, len(p_order))
    p_at = {int(r): i for i, r in enumerate(p_ranks)}
    for i, r in enumerate(c_ranks):
        j = p_at.get(int(r))
        if j is None:
            continue
        ci = c_order[c_bounds[i] : c_bounds[i + 1]]
        pi = p_order[p_bounds[j] : p_bounds[j + 1]]
        cls[ci], frac[ci] = classify(
            coll_start[ci], coll_end[ci], coll_step[ci], copy_start[pi], copy_end[pi], copy_step[pi]
        )
    return cls, frac


def end_ns(start_ns: np.ndarray, dur_us: np.ndarray) -> np.ndarray:
    """End time (ns) of records from their start (ns) and duration (us, float32)."""
    return np.asarray(start_ns, dtype=np.int64) + np.round(np.asarray(dur_us, dtype=np.float64) * 1e3).astype(np.int64)


def classify_columns(coll: Mapping[str, np.ndarray], copy: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(class, overlapped fraction) of every collective record, from record columns (rank,
    start_ns, dur_us, step) of collectives and copies: what the report and an A/B share."""
    return classify_ranks(
        coll["rank"],
        coll["start_ns"],
        end_ns(coll["start_ns"], coll["dur_us"]),
        coll["step"],
        copy["rank"],
        copy["start_ns"],
        end_ns(copy["start_ns"], copy["dur_us"]),
        copy["step"],
    )
