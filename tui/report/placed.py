"""Exact order statistics without a sort: an epoch's durations, and each rank's, with the values
that belong at the report's percentile positions put there, found through a histogram.

The report reads a few positions of each sorted array (p50, p90, p99 and the maximum:
:func:`workers.wire.stats.order_positions`). For non-negative finite float32 the order of the
values is the order of their bits, so a histogram of the bits' high part says which bin holds
each wanted position; only the values of those few bins are ordered (partitioned at the ranks
wanted in them). Per rank one pass builds
its histogram and one picks its candidates; the epoch's histogram is the sum of its ranks', so
the epoch needs no pass of its own. The arrays returned are permutations of the values (a
percentile that falls back to numpy reads them as any order); the values at the wanted
positions are the sorted array's, bit for bit. ~4x faster than numpy's multi-position
partition on the 2-core AMD EPYC VM, where numpy's SIMD sort is slow (see
:func:`tui.report.kernels._in_order`, which picks this or a sort).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.wire.stats import order_positions

#: Bits of the histogram's bins: 65,536 bins over the values' bit range.
BIN_BITS = 16
#: The wanted bins may hold 1/CROWDED of the values (counting the whole's and each part's).
CROWDED = 16


def placed(values: np.ndarray, starts: Sequence[int], qs: Sequence[float]) -> tuple[np.ndarray, np.ndarray] | None:
    """(each part's values with its own order positions placed, one array of the parts in
    order; the whole's values with the whole's positions placed; the same array where there is
    one part): ``values`` float32, every value non-negative and finite (the caller checks: their
    bits below 0x7F800000), parts ``values[starts[i]:starts[i + 1]]``, positions those of
    ``qs``, the median and the maximum (:func:`~workers.wire.stats.order_positions`).

    None where the bins holding those positions hold more than 1/:data:`CROWDED` of the values
    (all equal, a few distinct values, or one far outlier that makes every bin wide): picking
    among that many costs more than a sort, which the caller then does."""
    n = len(values)
    if n == 0:
        return values.copy(), values.copy()
    bits = values.view(np.uint32)
    lo, hi = int(bits.min()), int(bits.max())
    shift = max(0, (hi - lo).bit_length() - BIN_BITS)
    bins = ((hi - lo) >> shift) + 1
    base, sh = np.uint32(lo), np.uint32(shift)
    parts = []  # (start, its positions, each value's bin, its histogram, its positions' bins and below)
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if b > a:
            key = np.right_shift(bits[a:b] - base, sh, out=np.empty(b - a, dtype=np.uint32))
            hist = np.bincount(key, minlength=bins)
            pos = order_positions(b - a, qs)
            parts.append((a, pos, key, hist, _bins_of(hist, pos)))
    whole_hist = np.sum([h for _, _, _, h, _ in parts], axis=0) if len(parts) > 1 else parts[0][3]
    whole_pos = order_positions(n, qs)
    whole_bins, whole_below = _bins_of(whole_hist, whole_pos)
    crowd = int(whole_hist[np.unique(whole_bins)].sum())
    crowd += sum(int(h[np.unique(mine)].sum()) for _, _, _, h, (mine, _) in parts) if len(parts) > 1 else 0
    if crowd * CROWDED > 2 * n:  # candidates for the whole and for every part: 2n at most
        return None
    whole = values.copy()
    if len(parts) == 1:  # one part: it is the whole
        key = parts[0][2]
        idx = np.flatnonzero(_wanted(bins, whole_bins)[key])
        _place(whole, values, 0, whole_pos, _picks(values, key[idx], idx, whole_bins, whole_below, whole_pos))
        return whole, whole
    by_part = values.copy()
    for_the_whole = _wanted(bins, whole_bins)
    found: list[tuple[np.ndarray, np.ndarray]] = []  # per part: its candidates for the whole
    for a, pos, key, _, (mine, below) in parts:
        idx = np.flatnonzero(_wanted(bins, mine, whole_bins)[key])  # for its positions or the whole's
        their = key[idx]
        _place(by_part, values, a, pos, _picks(values, their, idx + a, mine, below, pos))
        for_whole = for_the_whole[their]
        found.append((idx[for_whole] + a, their[for_whole]))
    idx = np.concatenate([i for i, _ in found])
    keys = np.concatenate([k for _, k in found])
    _place(whole, values, 0, whole_pos, _picks(values, keys, idx, whole_bins, whole_below, whole_pos))
    return by_part, whole


def _wanted(bins: int, *wanted: np.ndarray) -> np.ndarray:
    """A look-up table over the bins: True where a bin is wanted."""
    table = np.zeros(bins, dtype=bool)
    for w in wanted:
        table[w] = True
    return table


def _bins_of(hist: np.ndarray, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(the bin of each sorted position, the values in the bins below it)."""
    cum = np.cumsum(hist)
    b = np.searchsorted(cum, positions, side="right")
    return b, cum[b] - hist[b]


def _picks(
    values: np.ndarray, keys: np.ndarray, idx: np.ndarray, bins: np.ndarray, below: np.ndarray, positions: list[int]
) -> np.ndarray:
    """The index in ``values`` of the value at each sorted position, each a different one: of
    the candidates ``idx`` (in bins ``keys``) in the position's bin, the one at the position's
    rank within its bin: any of them where the bin's values are all equal (a duration the
    clock rounds to one value, say), else by a partition of its values at the ranks wanted
    there (distinct indices at distinct ranks). A bin of many different values costs a
    partition of them, never a sort."""
    out = np.empty(len(positions), dtype=np.intp)
    ranks = np.asarray(positions, dtype=np.intp) - below
    for b in np.unique(bins).tolist():
        at = np.flatnonzero(bins == b)
        mine = idx[keys == b]
        kth = ranks[at]
        vals = values[mine]
        if vals.min() == vals.max():
            out[at] = mine[kth]
        else:
            out[at] = mine[np.argpartition(vals, kth)[kth]]
    return out


def _place(out: np.ndarray, values: np.ndarray, at: int, positions: list[int], src: np.ndarray) -> None:
    """``out`` (a copy of ``values``) with ``values[src]`` at ``at + positions`` and the values
    it displaces where those came from: still a permutation of ``values``."""
    dest = np.asarray(positions, dtype=np.intp) + at
    free = np.setdiff1d(src, dest)  # sources no value is put back at
    displaced = np.setdiff1d(dest, src)  # positions whose value must go somewhere
    out[dest] = values[src]
    out[free] = values[displaced]
