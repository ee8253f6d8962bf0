"""Per-chunk summaries of the collective records, written at record time.

``commtop report`` needs every duration (exact percentiles) but only sums and time windows of
the other columns: per (epoch, rank), the records' count, their duration, algbw and busbw sums
and their first start, last start and last end. The writer adds them to each chunk's collective
part (key ``"s"``: a few rows per chunk, one per (epoch, rank) in it), so a report reads the
duration, epoch, mode, op and size columns only: start times, algbw and busbw (a third of
the bytes, with algbw/busbw recomputed per record) stay packed.

Chunks without a summary (recordings made before it) are read as before. The values are those
of the records as the reader decodes them (float32 sums in float64, in record order), so a
report from the summaries equals the one from the columns up to the order of float64 additions
(chunk by chunk here, block by block there): ~1e-16 relative on the means, none on counts,
percentiles or windows. The header says a file has them (``chunk_summaries``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: The header key (and version) that says every chunk's collective part has a summary.
HEADER_KEY = "chunk_summaries"
VERSION = 1
#: Per row: epoch, rank, records, sums of dur_us / algbw / busbw, first start, last start, last end.
INT_FIELDS = ("e", "r", "n", "s0", "s1", "t1")
FLOAT_FIELDS = ("d", "a", "b")
FIELDS = (*INT_FIELDS, *FLOAT_FIELDS)
_DTYPE = {**{f: np.dtype("<i8") for f in INT_FIELDS}, **{f: np.dtype("<f8") for f in FLOAT_FIELDS}}
#: Rank ids fit in 20 bits of a group key (as in the report's grouping).
RANK_BITS = 20


def window_end_ns(start_ns: np.ndarray, dur_us: np.ndarray) -> np.ndarray:
    """A record's end as the report's epoch windows take it: start + whole ns of the duration
    (a NaN or infinite duration casts as the machine casts it, the same in writer and report)."""
    with np.errstate(invalid="ignore"):
        return start_ns + (dur_us.astype(np.float64) * 1e3).astype(np.int64)


def summarize(rank: np.ndarray, cols: dict[str, np.ndarray]) -> dict[str, bytes]:
    """The summary of one chunk's collective records (``rank`` per record; ``cols`` with epoch,
    start_ns, dur_us, algbw and busbw in their schema dtypes), one row per (epoch, rank)
    ascending; each field the bytes of a little-endian int64 or float64 array (a reader joins
    every chunk's in one numpy pass)."""
    epoch = cols["epoch"].astype(np.int64)
    keys = (epoch << RANK_BITS) | rank.astype(np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.ravel()
    rows = len(uniq)
    start = cols["start_ns"].astype(np.int64)
    s0, s1, t1 = _extremes(inverse, rows, start, start, window_end_ns(start, cols["dur_us"]))
    out = {
        "e": uniq >> RANK_BITS,
        "r": uniq & ((1 << RANK_BITS) - 1),
        "n": np.bincount(inverse, minlength=rows),
        "s0": s0,
        "s1": s1,
        "t1": t1,
    }
    for name, col in (("d", "dur_us"), ("a", "algbw"), ("b", "busbw")):
        out[name] = np.bincount(inverse, weights=cols[col].astype(np.float64), minlength=rows)
    return {f: out[f].astype(_DTYPE[f]).tobytes() for f in FIELDS}


def _extremes(
    inverse: np.ndarray, n: int, first: np.ndarray, last: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of ``inverse`` (n groups): min of ``first``, max of ``last``, max of ``end``."""
    s0 = np.full(n, np.iinfo(np.int64).max)
    s1 = np.full(n, np.iinfo(np.int64).min)
    t1 = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(s0, inverse, first)
    np.maximum.at(s1, inverse, last)
    np.maximum.at(t1, inverse, end)
    return s0, s1, t1


def summarizable(rank: np.ndarray) -> bool:
    """Whether a chunk's ranks fit the summary's key (always, for real ranks)."""
    return len(rank) == 0 or (int(rank.min()) >= 0 and int(rank.max()) < 1 << RANK_BITS)


def valid(value: Any) -> bool:
    """Whether ``value`` is shaped as the writer writes a summary: every field's bytes, the
    same number of 8-byte values in each (else the report reads the columns)."""
    if not isinstance(value, dict) or len(value) != len(FIELDS):
        return False
    fields = [value.get(f) for f in FIELDS]
    sizes = {len(v) for v in fields if type(v) is bytes}
    return len(sizes) == 1 and all(type(v) is bytes for v in fields) and sizes.pop() % 8 == 0


def join(summaries: Sequence[dict[str, bytes]]) -> dict[str, np.ndarray]:
    """The rows of many chunks' (valid) summaries, in file order, as numpy columns."""
    return {f: np.frombuffer(b"".join(s[f] for s in summaries), dtype=_DTYPE[f]) for f in FIELDS}


def by_key(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows folded per (epoch, rank) key (``epoch << 20 | rank``, ascending): counts and
    sums added in file order, first/last times as min/max."""
    keys = (rows["e"] << RANK_BITS) | rows["r"]
    uniq, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.ravel()
    n = len(uniq)
    counts = np.zeros(n, dtype=np.int64)
    np.add.at(counts, inverse, rows["n"])
    out = {"key": uniq, "n": counts}
    for f in FLOAT_FIELDS:
        out[f] = np.bincount(inverse, weights=rows[f], minlength=n)
    s0, s1, t1 = _extremes(inverse, n, rows["s0"], rows["s1"], rows["t1"])
    out.update(s0=s0, s1=s1, t1=t1)
    return out
