"""Bounded-memory statistics for the model: ring buffers, run-wide aggregates, axis scaling.

Plain Python + numpy (no Textual): everything here is written once per *batch* of records
with vectorised numpy, never once per record, so the model keeps up with ~1e6 records/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from workers.wire.stats import percentiles_and_max_sorted

#: Records kept per rank (and per kind) for windowed statistics and sparklines.
RING_SIZE = 4096


class Ring:
    """Fixed-length column store: the newest ``size`` rows of a stream of columnar batches.

    Rows are written with one slice assignment per column (two at the wrap), so appending a
    batch costs O(columns), not O(records) Python work. ``view()`` returns the rows oldest
    first, as copies, so a caller may keep them after the ring moves on.
    """

    def __init__(self, dtypes: Mapping[str, str | np.dtype], size: int = RING_SIZE) -> None:
        if size <= 0:
            raise ValueError("ring size must be positive")
        self.size = size
        self.cols: dict[str, np.ndarray] = {name: np.zeros(size, dtype=dt) for name, dt in dtypes.items()}
        self.head = 0  # index the next row goes to
        self.filled = 0  # rows held (<= size)
        self.total = 0  # rows ever appended

    def __len__(self) -> int:
        return self.filled

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Append a batch; ``columns`` must hold every ring column, all of one length."""
        n = len(next(iter(columns.values())))
        if n == 0:
            return
        self.total += n
        skip = max(0, n - self.size)  # a batch larger than the ring keeps only its tail
        n_keep = n - skip
        start = (self.head + skip) % self.size
        first = min(n_keep, self.size - start)
        if not skip and first == n:  # the usual batch: one slice per column, no views of it
            end = start + n
            for name, dest in self.cols.items():
                dest[start:end] = columns[name]
        else:
            for name, dest in self.cols.items():
                src = columns[name][skip:]
                dest[start : start + first] = src[:first]
                if first < n_keep:
                    dest[: n_keep - first] = src[first:]
        self.head = (start + n_keep) % self.size
        self.filled = min(self.size, self.filled + n)

    def window(self, time_col: str, span_ns: int, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
        """``columns`` of the rows whose ``time_col`` lies within ``span_ns`` of its largest
        value, oldest first: views where those rows are contiguous (for a caller done with
        them before the next ``append``), else copies of those rows only. A rank's numbers read
        5 columns of a ~5 s window; a full ring's ``view`` joined all 15 of its 4,096 rows."""
        t = self.view(copy=False, columns=(time_col,))[time_col]
        if len(t) == 0:
            return {name: self.cols[name][:0] for name in columns}
        keep = t >= t.max() - span_ns
        first = int(np.argmax(keep))
        if keep[first:].all():  # rows in time order (the usual case): the window is the newest rows
            return self.view(len(t) - first, copy=False, columns=columns)
        return {name: col[keep] for name, col in self.view(copy=False, columns=columns).items()}

    def view(
        self, last: int | None = None, *, copy: bool = True, columns: tuple[str, ...] | None = None
    ) -> dict[str, np.ndarray]:
        """The newest ``last`` rows (all held rows by default), oldest first; only ``columns``
        when given (a wrapped ring copies what it returns: copy no more than is needed).

        ``copy=False`` returns views into the ring where the rows are contiguous: only for
        a caller that is done with them before the next ``append``.
        """
        n = self.filled if last is None else max(0, min(last, self.filled))
        start = (self.head - n) % self.size
        cols = self.cols if columns is None else {name: self.cols[name] for name in columns}
        if start + n <= self.size:
            if copy:
                return {name: col[start : start + n].copy() for name, col in cols.items()}
            return {name: col[start : start + n] for name, col in cols.items()}
        return {name: np.concatenate((col[start:], col[: self.head])) for name, col in cols.items()}

    def clear(self) -> None:
        self.head = self.filled = self.total = 0


class LogHistogram:
    """Run-wide distribution of positive values in fixed memory, for percentiles of a whole run.

    Bins are logarithmic, ``BINS_PER_DECADE`` per decade from ``LO`` to ``HI``: a value is
    reported as its bin's geometric centre, so a percentile is within about
    +/-1.2 % (half a bin: 10**(1/200) - 1) of the exact one. Values outside the range fall
    in the first/last bin (and ``min``/``max`` are kept exactly by ``RunAggregate``).
    """

    BINS_PER_DECADE = 100
    LO = 1e-1  # 0.1 us
    HI = 1e9  # 1000 s in us
    N_BINS = int(round(math.log10(HI / LO) * BINS_PER_DECADE))

    def __init__(self) -> None:
        self.counts = np.zeros(self.N_BINS, dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            idx = np.floor(np.log10(np.maximum(v, self.LO) / self.LO) * self.BINS_PER_DECADE)
        idx = np.nan_to_num(idx, nan=0.0)
        idx = np.clip(idx, 0, self.N_BINS - 1).astype(np.intp)
        self.counts += np.bincount(idx, minlength=self.N_BINS)

    def merge(self, other: LogHistogram) -> None:
        self.counts += other.counts

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float:
        """The value below which a fraction ``q`` of the values lie (NaN when empty), to the
        histogram's resolution; :class:`RunAggregate` clamps it to the exact min and max."""
        total = self.counts.sum()
        if total == 0:
            return math.nan
        cum = np.cumsum(self.counts)
        # Nearest-rank definition, like np.percentile(method="inverted_cdf").
        rank = max(1, math.ceil(q * total))
        i = int(np.searchsorted(cum, rank))
        return float(self.LO * 10 ** ((i + 0.5) / self.BINS_PER_DECADE))


@dataclass(frozen=True)
class RunStats:
    """Whole-run summary of one stream (e.g. one rank's collective durations in one mode)."""

    count: int = 0
    mean_ms: float = math.nan
    min_ms: float = math.nan
    max_ms: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    busbw_gbps: float = math.nan  # at the run's average duration, like nccl-tests
    exact: bool = True  # percentiles exact (workers.wire.stats); else from the log histogram (+/-1.2 %)


class RunAggregate:
    """count / sum / min / max / log-histogram of durations (us), plus bandwidth sums.

    Percentiles are exact (:func:`workers.wire.stats.percentiles`, the definition the report
    uses) while the run has at most ``EXACT_CAP`` values: those are kept as float32 (64 KB).
    Past that, they come from the log histogram (+/-1.2 %), clamped to the exact min and max,
    and ``RunStats.exact`` says so.

    ``bw_weighted`` accumulates busbw x duration so ``busbw = bw_weighted / sum`` is the
    bandwidth at the average duration (nccl-tests reports busbw of the average time).

    Batches are folded in lazily, ``FOLD_RECORDS`` (or ``FOLD_BATCHES``) at a time: a live
    run delivers many small batches (64 ranks x 20 batches/s of ~20 records), and numpy's
    cost per *call* dominated; pending values are copies, so memory stays bounded.
    """

    FOLD_RECORDS = 2048
    FOLD_BATCHES = 32
    EXACT_CAP = 16384

    def __init__(self) -> None:
        self._count = 0
        self.sum_us = 0.0
        self.min_us = math.inf
        self.max_us = -math.inf
        self.bw_weighted = 0.0
        self.hist = LogHistogram()
        self._exact: list[np.ndarray] | None = []  # every value while count <= EXACT_CAP
        self._sorted_head = False  # whether _exact[0] is sorted (the values up to the last stats())
        self._pending: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._pending_n = 0

    @property
    def count(self) -> int:
        return self._count + self._pending_n

    def add(self, dur_us: np.ndarray, bw: np.ndarray | None = None) -> None:
        n = len(dur_us)
        if n == 0:
            return
        self._pending.append((np.array(dur_us, dtype=np.float64), None if bw is None else np.array(bw, np.float64)))
        self._pending_n += n
        if self._pending_n >= self.FOLD_RECORDS or len(self._pending) >= self.FOLD_BATCHES:
            self._fold()

    def _fold(self) -> None:
        """Apply the pending batches with one pass of numpy calls."""
        pending = self._pending
        if not pending:
            return
        self._pending, self._pending_n = [], 0
        d = pending[0][0] if len(pending) == 1 else np.concatenate([p[0] for p in pending])
        self._count += len(d)
        self.sum_us += float(d.sum())
        self.min_us = min(self.min_us, float(d.min()))
        self.max_us = max(self.max_us, float(d.max()))
        with_bw = [p for p in pending if p[1] is not None]
        if with_bw:
            bw = np.concatenate([p[1] for p in with_bw])  # type: ignore[misc]
            dd = d if len(with_bw) == len(pending) else np.concatenate([p[0] for p in with_bw])
            self.bw_weighted += float(np.dot(bw, dd))
        self.hist.add(d)
        self._keep_exact([d])

    def _keep_exact(self, parts: list[np.ndarray]) -> None:
        if self._exact is None:
            return
        if self._count > self.EXACT_CAP:
            self._exact = None
            return
        self._exact.extend(part.astype(np.float32) for part in parts)
        if len(self._exact) > 8:
            keep = 1 if self._sorted_head else 0  # the sorted run stays whole
            self._exact[keep:] = [np.concatenate(self._exact[keep:])]

    def merge(self, other: RunAggregate) -> None:
        self._fold()
        other._fold()
        self._count += other._count
        self.sum_us += other.sum_us
        self.min_us = min(self.min_us, other.min_us)
        self.max_us = max(self.max_us, other.max_us)
        self.bw_weighted += other.bw_weighted
        self.hist.merge(other.hist)
        if other._exact is None:
            self._exact = None
        else:
            self._keep_exact(other._exact)

    def _sorted_exact(self) -> np.ndarray:
        """The exact values sorted, and kept sorted for the next call: only what came since is
        sorted, then merged with the kept run by a stable sort (timsort finds the two runs and
        merges them in linear time). A live rank's whole-run numbers are read about once a
        second, each time with a little more: 16 K values sorted again cost ~250 us on the VM,
        a merge with a few hundred new ones ~30."""
        parts = self._exact or []
        head = parts[0] if self._sorted_head else None
        new = parts[1:] if head is not None else parts
        if not new and head is not None:
            return head
        fresh = np.sort(new[0] if len(new) == 1 else np.concatenate(new))
        ordered = fresh if head is None else np.sort(np.concatenate((head, fresh)), kind="stable")
        self._exact, self._sorted_head = [ordered], True
        return ordered

    def stats(self) -> RunStats:
        self._fold()
        if self._count == 0:
            return RunStats()
        if self._exact is not None:
            ordered = self._sorted_exact()
            p50, p99 = percentiles_and_max_sorted(ordered, (50, 99))[0]
        else:
            p50, p99 = (min(self.max_us, max(self.min_us, self.hist.quantile(q))) for q in (0.50, 0.99))
        return RunStats(
            count=self._count,
            mean_ms=self.sum_us / self._count / 1e3,
            min_ms=self.min_us / 1e3,
            max_ms=self.max_us / 1e3,
            p50_ms=p50 / 1e3,
            p99_ms=p99 / 1e3,
            busbw_gbps=self.bw_weighted / self.sum_us if self.sum_us > 0 else math.nan,
            exact=self._exact is not None,
        )


def pooled_stats(aggregates: Iterable[RunAggregate]) -> RunStats:
    """The statistics of ``aggregates`` pooled. Where only one holds records (one mode, one
    epoch: the usual live run) they are its own, which are the same numbers, without copying
    its values into a new aggregate and sorting them again."""
    holding = [a for a in aggregates if a.count]
    if len(holding) == 1:
        return holding[0].stats()
    total = RunAggregate()
    for agg in holding:
        total.merge(agg)
    return total.stats()


def weighted_rate(amount: np.ndarray, dur_us: np.ndarray) -> float:
    """sum(amount x dur) / sum(dur): a bandwidth at the average duration (NaN when empty)."""
    total = float(np.sum(dur_us, dtype=np.float64))
    if len(dur_us) == 0 or total <= 0:
        return math.nan
    return float(np.dot(np.asarray(amount, dtype=np.float64), np.asarray(dur_us, dtype=np.float64))) / total


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k that is >= ``value``."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        top = step * 10**exp
        if top >= value * (1 - 1e-9):
            return top
    return 10 ** (exp + 1)


class AxisScale:
    """A y-axis top that follows the data but changes at most once per ``min_interval_s``.

    Like nitop's graphs: re-scaling on every frame makes bars jump; here the top is a
    "nice" number above the data, re-evaluated at most once a second; in between, values
    above the top are drawn clipped (and marked as such by the widget).
    """

    def __init__(self, min_interval_s: float = 1.0, headroom: float = 1.15) -> None:
        self.min_interval_s = min_interval_s
        self.headroom = headroom
        self.top = math.nan
        self._changed_at = -math.inf

    def update(self, data_max: float, now_s: float) -> float:
        """Feed the current maximum of the visible data; returns the top to draw with."""
        if not math.isfinite(data_max) or data_max <= 0:
            return self.top if math.isfinite(self.top) else 1.0
        wanted = nice_ceiling(data_max * self.headroom)
        if not math.isfinite(self.top):
            self.top, self._changed_at = wanted, now_s
        elif wanted != self.top and now_s - self._changed_at >= self.min_interval_s:
            self.top, self._changed_at = wanted, now_s
        return self.top


def uniform(a: np.ndarray) -> bool:
    """Every value of ``a`` equals the first (a bytes comparison: cheaper than numpy calls
    on the small arrays of a batch)."""
    raw = a.tobytes()
    width = a.itemsize
    return raw == raw[:width] * (len(raw) // width)
