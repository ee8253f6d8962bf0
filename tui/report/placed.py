"""Exact order statistics without a sort: an epoch's durations, and each rank's, with the values
that belong at the report's percentile positions put there, found through a histogram.

The report reads a few positions of each sorted array (p50, p90, p99 and the maximum:
:func:`workers.wire.stats.order_positions`). For non-negative finite float32 the order of the
values is the order of their bits, so a histogram of the bits' high part says which bin holds
each wanted position; only the values of those few bins are sorted. Per rank one pass builds
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


def placed(values: np.ndarray, starts: Sequence[int], qs: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(each part's values with its own order positions placed, one array of the parts in
    order; the whole's values with the whole's positions placed; the same array where there is
    one part): ``values`` float32, every value non-negative and finite (the caller checks: their
    bits below 0x7F800000), parts ``values[starts[i]:starts[i + 1]]``, positions those of
    ``qs``, the median and the maximum (:func:`~workers.wire.stats.order_positions`)."""
    n = len(values)
    if n == 0:
        return values.copy(), values.copy()
    bits = values.view(np.uint32)
    lo, hi = int(bits.min()), int(bits.max())
    shift = max(0, (hi - lo).bit_length() - BIN_BITS)
    bins = ((hi - lo) >> shift) + 1
    base, sh = np.uint32(lo), np.uint32(shift)
    bounds = list(zip(starts[:-1], starts[1:], strict=True))
    keys = [np.right_shift(bits[a:b] - base, sh, out=np.empty(b - a, dtype=np.uint32)) for a, b in bounds]
    hists = [np.bincount(k, minlength=bins) for k in keys]
    whole_pos = order_positions(n, qs)
    whole_bins, whole_below = _bins_of(np.sum(hists, axis=0) if len(hists) > 1 else hists[0], whole_pos)
    whole = values.copy()
    if len(bounds) == 1:  # one part: it is the whole
        idx = np.flatnonzero(_wanted(bins, whole_bins)[keys[0]])
        _place(whole, values, 0, whole_pos, _picks(values, keys[0][idx], idx, whole_bins, whole_below, whole_pos))
        return whole, whole
    by_part = values.copy()
    found: list[tuple[np.ndarray, np.ndarray]] = []  # per part: its candidates for the whole
    for (a, b), key, hist in zip(bounds, keys, hists, strict=True):
        if b == a:
            continue
        pos = order_positions(b - a, qs)
        mine, below = _bins_of(hist, pos)
        idx = np.flatnonzero(_wanted(bins, mine, whole_bins)[key])  # for its positions or the whole's
        their = key[idx]
        _place(by_part, values, a, pos, _picks(values, their, idx + a, mine, below, pos))
        for_whole = np.isin(their, whole_bins)
        found.append((idx[for_whole] + a, their[for_whole]))
    idx = np.concatenate([i for i, _ in found])
    _place(
        whole,
        values,
        0,
        whole_pos,
        _picks(values, np.concatenate([k for _, k in found]), idx, whole_bins, whole_below, whole_pos),
    )
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
    """The index in ``values`` of the value at each sorted position: of the candidates ``idx``
    (in bins ``keys``) in the position's bin, ordered by (value, index), the one at the
    position's rank within its bin."""
    out = np.empty(len(positions), dtype=np.intp)
    for i, (b, p, under) in enumerate(zip(bins.tolist(), positions, below.tolist(), strict=True)):
        mine = idx[keys == b]
        order = np.lexsort((mine, values[mine]))  # by value, ties by index: one element per rank
        out[i] = mine[order[p - under]]
    return out


def _place(out: np.ndarray, values: np.ndarray, at: int, positions: list[int], src: np.ndarray) -> None:
    """``out`` (a copy of ``values``) with ``values[src]`` at ``at + positions`` and the values
    it displaces where those came from: still a permutation of ``values``."""
    dest = np.asarray(positions, dtype=np.intp) + at
    free = np.setdiff1d(src, dest)  # sources no value is put back at
    displaced = np.setdiff1d(dest, src)  # positions whose value must go somewhere
    out[dest] = values[src]
    out[free] = values[displaced]
