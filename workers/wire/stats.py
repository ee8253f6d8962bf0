"""The one percentile definition of commtop: numpy's default, method "linear" (Hyndman-Fan
type 7, as in nccl-tests' usual post-processing with pandas or numpy).

The worker's summary line, the live view, the headless summary and ``commtop report`` all
call :func:`percentiles`, so they print the same p50/p99 for the same records, and a
percentile never exceeds the maximum.

Not ``np.percentile`` itself: its first call in numpy 2 imports ``numpy.ma`` (0.3-3.6 s of a
stopping worker on a busy host), and it converts float32 to float64 before sorting. Here the
values are sorted as they are (a SIMD sort; 4x a multi-kth partition for 10 M float32) and
numpy's interpolation is repeated operation for operation, so results are bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: The name of the definition, for tables and docs.
PERCENTILE_METHOD = "linear (numpy's default)"


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """Percentiles ``qs`` (0..100) of ``values``; NaN for each when ``values`` is empty."""
    return percentiles_and_max(values, qs)[0]


def percentile(values: np.ndarray, q: float) -> float:
    """One percentile (0..100) of ``values``; NaN when empty."""
    return percentiles_and_max(values, (q,))[0][0]


def percentiles_and_max(values: np.ndarray, qs: Sequence[float]) -> tuple[list[float], float]:
    """(percentiles ``qs`` exactly as ``np.percentile(values.astype(np.float64), qs)``, the
    maximum), from one sort. NaN values, or a zero at an interpolation point (+0 and -0 sort
    as equals but interpolate differently), take numpy's own path."""
    if len(values) == 0:
        return [math.nan for _ in qs], math.nan
    return _from_ordered(np.sort(values), values, qs)


def percentiles_and_max_sorted(ordered: np.ndarray, qs: Sequence[float]) -> tuple[list[float], float]:
    """:func:`percentiles_and_max` of values already sorted (``ordered`` = ``np.sort(values)``:
    ascending, NaN last), bit for bit the same, without sorting again (the report sorts a whole
    epoch once and reads every rank's and class's values out of it in order)."""
    if len(ordered) == 0:
        return [math.nan for _ in qs], math.nan
    return _from_ordered(ordered, ordered, qs)


def _plan(n: int, qs: Sequence[float]) -> list[tuple[float, int, int, int]]:
    """Per percentile: (its fractional position, the position below it or -1 at the top, the two
    positions numpy's "linear" interpolates between)."""
    plan = []
    for q in qs:
        v = (n - 1) * (q / 100)
        prev = -1 if v >= n - 1 else math.floor(v)
        plan.append((v, prev, n - 1 if prev < 0 else prev, n - 1 if prev < 0 else prev + 1))
    return plan


def order_positions(n: int, qs: Sequence[float]) -> list[int]:
    """The positions of ``n`` sorted values that :func:`percentiles_and_max_sorted` reads for
    ``qs`` (the maximum's included), ascending. An array whose values at these positions are the
    sorted array's (``np.partition(values, order_positions(len(values), qs))``) gives the same
    result as the sorted array, for ``qs`` or any of them."""
    return sorted({n - 1} | {i for _, _, a, b in _plan(n, qs) for i in (a, b)}) if n else []


def _from_ordered(ordered: np.ndarray, values: np.ndarray, qs: Sequence[float]) -> tuple[list[float], float]:
    n = len(ordered)
    plan = _plan(n, qs)
    kth = order_positions(n, qs)
    vals = dict(zip(kth, ordered[kth].astype(np.float64).tolist(), strict=True))
    if vals[n - 1] != vals[n - 1] or any(vals[a] == 0 or vals[b] == 0 for _, _, a, b in plan):
        wide = np.asarray(values, dtype=np.float64)
        return np.percentile(wide, list(qs)).tolist(), float(wide.max())
    out = []
    for v, prev, a, b in plan:
        lo, hi, t = vals[a], vals[b], v - prev
        diff = hi - lo
        out.append(hi - diff * (1 - t) if t >= 0.5 else lo + diff * t)
    return out, vals[n - 1]


def median(values: np.ndarray | Sequence[float]) -> float:
    """``float(np.median(values))`` bit for bit, for a float array or a list of floats, without
    np.median's dispatch (~40 us, where the live snapshot takes a few medians of a few hundred
    values at 15 Hz): one sort, then the middle value or numpy's mean of the two middle ones
    (their sum from zero in the values' float type, halved). NaN when empty or when any value is NaN."""
    ordered = np.sort(np.asarray(values))
    n = len(ordered)
    if n == 0 or ordered.dtype.kind != "f":
        return float(np.median(ordered)) if n else math.nan
    if ordered[-1] != ordered[-1]:  # NaN sorts last
        return math.nan
    k = n // 2
    zero = ordered.dtype.type(0)  # numpy's mean adds to a zero: -0.0 comes out as 0.0
    return float(zero + ordered[k]) if n % 2 else float((zero + ordered[k - 1] + ordered[k]) / 2)
