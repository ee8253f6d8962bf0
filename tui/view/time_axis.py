"""The latency chart's time axis: which wall-clock interval each chart column covers.

The rank grid buckets iterations (``k`` per column); the links panel draws NVML samples.
Both must put the same moment in the same column, so the column edges are computed once,
here, from the iterations' start times, and both widgets use them. Plain numpy (no Textual).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: A telemetry sample stands for the interval since the sample before it (NVML counters are
#: rates over the tick); a column further than this before its covering sample stays blank.
MAX_HOLD_NS = 2_000_000_000


@dataclass(frozen=True)
class TimeAxis:
    """Column j of the chart covers host time ``[edges_ns[j], edges_ns[j + 1])``; the chart's
    first column is terminal column ``x0`` of its widget. No edges = no time known yet."""

    x0: int = 0
    edges_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def cells(self) -> int:
        return max(0, len(self.edges_ns) - 1)

    @property
    def start_ns(self) -> int:
        return int(self.edges_ns[0]) if len(self.edges_ns) else 0


def iteration_edges(start_ns: np.ndarray, first_iteration: int, start_it: int, cells: int, k: int) -> np.ndarray:
    """Start time of each column's first iteration (``cells + 1`` edges) for columns of ``k``
    iterations from ``start_it``; ``start_ns[i]`` is iteration ``first_iteration + i``'s start
    (0 = unknown). Unknown edges are interpolated, and extrapolated at the iteration rate of
    the known ones; an empty array when fewer than two iterations have a start time."""
    if cells <= 0 or len(start_ns) == 0:
        return np.zeros(0, dtype=np.int64)
    its = start_it + k * np.arange(cells + 1, dtype=np.int64)
    known_i = np.flatnonzero(start_ns > 0)
    if len(known_i) < 2:
        return np.zeros(0, dtype=np.int64)
    base = int(start_ns[known_i[0]])  # float math on offsets: 1.8e18 ns has no ns resolution in a double
    known_it = (known_i + first_iteration).astype(np.float64)
    known_t = (start_ns[known_i] - base).astype(np.float64)
    per_it = (known_t[-1] - known_t[0]) / (known_it[-1] - known_it[0])
    edges = np.interp(its.astype(np.float64), known_it, known_t)
    before, after = its < known_it[0], its > known_it[-1]
    edges[before] = known_t[0] - (known_it[0] - its[before]) * per_it
    edges[after] = known_t[-1] + (its[after] - known_it[-1]) * per_it
    return np.maximum.accumulate(np.round(edges).astype(np.int64) + base)


def resample(times_ns: np.ndarray, values: np.ndarray, edges_ns: np.ndarray) -> np.ndarray:
    """The value of a sampled rate in every column: the max of the samples that cover the
    column (a sample covers the time since the previous one), NaN where none does.

    Column j is covered by samples ``lo[j]`` (the first after its start) through ``hi[j]``
    (the first at or after its end); vectorised, as the links panel calls this per GPU and
    link for every snapshot."""
    n = len(edges_ns) - 1
    if n <= 0:
        return np.full(max(0, n), np.nan)
    if len(times_ns) == 0:
        return np.full(n, np.nan)
    m = len(times_ns)
    vals = np.append(np.where(np.isnan(values), -np.inf, values.astype(np.float64)), -np.inf)  # [m] = none
    lo = np.searchsorted(times_ns, edges_ns[:-1], side="right")  # first sample after the column start
    hi = np.searchsorted(times_ns, edges_ns[1:], side="left")  # first sample at/after the column end
    idx = np.empty(2 * n, dtype=np.intp)
    idx[0::2], idx[1::2] = lo, hi
    inner = np.maximum.reduceat(vals, idx)[0::2]  # max over [lo, hi): samples inside the column
    inner[lo >= hi] = -np.inf
    out = np.maximum(inner, vals[hi])  # and the sample that covers the column's end
    out[np.isneginf(out)] = np.nan
    first = np.minimum(lo, m - 1)
    # A column whose covering sample came long after it (a gap, or before the first tick) is blank.
    out[times_ns[first] - edges_ns[1:] > MAX_HOLD_NS] = np.nan
    return out
