"""The rank grid's geometry and cells: how wide the fixed columns are at a terminal width, and
the latency history bucketed into chart cells (``k`` iterations each, aligned to multiples of
``k`` so the picture does not shimmer as iterations arrive) with the y-axis they share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tui.model.history import NO_MODE
from tui.model.snapshot import History
from tui.view.time_axis import iteration_edges
from workers.wire.stats import percentile

#: Fixed columns left of the sparkline: state, rank, host:gpu, last, p50, p99, busbw, copy.
HOST_W = 15
NUM_W = 8
FIXED_W = 2 + 5 + 2 + HOST_W + 5 * NUM_W + 2
HEAT_LABEL_W = 8
MIN_SPARK = 8
#: Without host:gpu and copy columns (terminals narrower than NARROW_BELOW): more chart columns.
NARROW_W = 2 + 5 + 2 + 4 * NUM_W + 2
NARROW_BELOW = FIXED_W + 40


def is_narrow(width: int) -> bool:
    """An 80-column terminal drops host:gpu and copy: 14 chart columns become 37."""
    return 0 < width < NARROW_BELOW


def fixed_width(width: int) -> int:
    """Columns left of the latency chart at this terminal width."""
    return NARROW_W if is_narrow(width) else FIXED_W


@dataclass(frozen=True)
class Cells:
    """Latency (ms) and mode per (rank, cell); cell j covers ``k`` iterations."""

    ms: np.ndarray  # (ranks, cells) float, NaN = no data
    mode: np.ndarray  # (ranks, cells) int, -1 = no data
    k: int
    first_iteration: int  # iteration of the first cell's first column
    first_start_ns: int  # host time of the first visible iteration (0 = unknown)
    #: Host time where each cell starts, plus the end of the last (cells + 1; empty = unknown).
    edges_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: The newest iteration drawn (-1: none).
    last_iteration: int = -1


def settled_last(history: History, wait_its: int, not_before: int = -1) -> int:
    """The newest iteration every rank has reported, unless a rank is more than ``wait_its``
    iterations behind the newest any has: such a rank (late, stalled, exited) does not hold
    the chart back, and shows its gap. Never before ``not_before`` (the last frame's edge) while
    the history reaches it: a late rank's batch must not scroll the chart back.

    Why: ranks publish their records in batches (every 50 ms, up to 500 ms in large worlds),
    so at any moment most are a batch behind the newest. A chart that ended at the newest
    iteration blinked the last cells of the others on and off at every frame, and each blink
    repainted a rank's whole lines (half of the lower bar lines at 8 ranks)."""
    ms = history.ms
    n_ranks, n_cols = ms.shape
    last = history.first_iteration + n_cols - 1
    if n_ranks < 2 or n_cols == 0 or wait_its <= 0:
        return last
    have = np.isfinite(ms[:, -min(n_cols, wait_its + 1) :])
    reporting = have.any(axis=1)
    if not reporting.any():
        return last
    # Columns from the newest back to each reporting rank's newest record.
    behind = np.argmax(have[reporting, ::-1], axis=1)
    settled = last - int(behind.max())
    return not_before if settled < not_before <= last else settled


def bucket(history: History, cells: int, k: int, wait_its: int = 0, not_before: int = -1) -> Cells:
    """The last ``cells`` buckets of ``k`` iterations, max latency per bucket, up to the
    iteration every rank has reported (``wait_its``, ``not_before``: see :func:`settled_last`).

    Max, not mean: a profiler should show the spike, not average it away.
    """
    n_ranks, n_cols = history.ms.shape
    cells = max(0, cells)
    if n_cols == 0 or cells == 0:
        return Cells(np.full((n_ranks, cells), np.nan), np.full((n_ranks, cells), -1), k, history.first_iteration, 0)
    last = settled_last(history, wait_its, not_before)
    start_it = (last // k - cells + 1) * k
    lo, hi = max(start_it, history.first_iteration), last
    src = slice(lo - history.first_iteration, hi - history.first_iteration + 1)
    # Only the cells the history reaches are computed (the screen usually spans more
    # iterations than the history holds: the rest stays NaN / -1 without being touched).
    j_lo, j_hi = (lo - start_it) // k, (hi - start_it) // k
    part_it = start_it + j_lo * k  # first iteration of the first computed cell
    width = (j_hi - j_lo + 1) * k
    ms = np.full((n_ranks, width), np.nan, dtype=np.float32)
    mode = np.full((n_ranks, width), -1, dtype=np.int16)
    dst = slice(lo - part_it, hi - part_it + 1)
    ms[:, dst] = history.ms[:, src]
    m = history.mode[:, src].astype(np.int16)
    mode[:, dst] = np.where(m == NO_MODE, -1, m)
    out_ms = np.full((n_ranks, cells), np.nan, dtype=np.float32)
    out_mode = np.full((n_ranks, cells), -1, dtype=np.int16)
    if n_ranks:
        # fmax skips NaN (all-NaN -> NaN) without nanmax's copy of the array.
        out_ms[:, j_lo : j_hi + 1] = _bucket_max(ms.reshape(n_ranks, -1, k), np.fmax)
        out_mode[:, j_lo : j_hi + 1] = _bucket_max(mode.reshape(n_ranks, -1, k), np.maximum)
    first_start = 0
    if len(history.start_ns):
        visible = history.start_ns[src]
        nz = visible[visible > 0]
        first_start = int(nz[0]) if len(nz) else 0
    edges = iteration_edges(history.start_ns, history.first_iteration, start_it, cells, k)
    return Cells(out_ms, out_mode, k, start_it, first_start, edges, last)


def _bucket_max(cells: np.ndarray, op: np.ufunc) -> np.ndarray:
    """``op``-reduction over the last axis (the k iterations of a cell) as k whole-array steps:
    a numpy reduction over a short last axis runs its inner loop once per cell (10 ms for
    512 ranks x 1024 iterations), k element-wise passes take well under 1 ms."""
    out = cells[..., 0].copy()
    for j in range(1, cells.shape[-1]):
        op(out, cells[..., j], out=out)
    return out


def visible_top(cells: Cells) -> float:
    """The latency the y-axis should cover: the 99th percentile of the visible cells, so
    one spike is drawn clipped instead of flattening every other rank."""
    finite = cells.ms[np.isfinite(cells.ms)]
    if len(finite) == 0:
        return math.nan
    return _percentile_by_partition(finite, 99)


def _percentile_by_partition(values: np.ndarray, q: float) -> float:
    """``workers.wire.stats.percentile`` (numpy's linear method, bit for bit) from the two
    order statistics it needs, found with a partition instead of a sort (512 ranks x 150
    cells: 0.5 ms, not 4). Zeros at the interpolation points take the sorting path, which
    reproduces numpy's handling of signed zeros."""
    n = len(values)
    v = (n - 1) * (q / 100)
    prev = -1 if v >= n - 1 else math.floor(v)
    a, b = (n - 1, n - 1) if prev < 0 else (prev, prev + 1)
    part = np.partition(values, (a, b) if a != b else a)
    lo, hi = float(part[a]), float(part[b])
    if lo == 0 or hi == 0:
        return percentile(values, q)
    t = v - prev
    diff = hi - lo
    return hi - diff * (1 - t) if t >= 0.5 else lo + diff * t
