"""Steps of a run, derived from the records' ``step`` column (the synthetic loop numbers its
steps, a captured job counts optimizer steps, a monitored job its ``mon.step(n)`` blocks).

The rule, one owner for the live view, the headless summary and the report: on each rank, a
step *starts* at the start of its first collective record (in the rank's issue order); a
step's *time* is the start of step s + 1 minus the start of step s, counted only where the
rank recorded both s and s + 1 (a step without collectives, or whose records were lost, leaves
a gap rather than one long step). steps/s = (last step - first step) / (time between their
starts). Copies are counted per step begun; "collectives during copies" are those the overlap
classifier (:mod:`workers.wire.overlap`) labels so.

Per batch the live tracker costs a fixed number of numpy calls; the report's kernel
(:func:`step_boundaries`) runs over millions of records grouped by (epoch, rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tui.model.stats import RunAggregate, RunStats
from workers.wire.overlap import end_ns
from workers.wire.protocol import DIRECTIONS
from workers.wire.stats import median

#: Step starts kept per rank for the windowed steps/s.
RECENT_STEPS = 256
#: The windowed steps/s covers this much record time.
RATE_WINDOW_S = 5.0
#: (direction, pinned) classes of copies: direction index x 2 + pinned.
COPY_CLASSES = tuple((d, pinned) for d in DIRECTIONS for pinned in (False, True))


@dataclass(frozen=True)
class CopyStep:
    """Copies of one direction and host memory, per step."""

    direction: str
    pinned: bool
    per_step: float  # copies per step begun
    bytes_per_step: float
    gbps: float  # bytes / copy time


@dataclass(frozen=True)
class StepView:
    """The step view of a run (or of one rank): how long steps take and what is in them."""

    steps: int = 0  # steps begun (summed over ranks)
    steps_per_s: float = math.nan  # median over ranks
    step: RunStats = RunStats()  # step times (ms), all ranks pooled
    coll_ms_per_step: float = math.nan  # time at least one collective ran, per closed step
    copies: tuple[CopyStep, ...] = ()
    during_per_step: float = math.nan  # collectives that overlapped a copy, per step

    @property
    def has_steps(self) -> bool:
        """At least one step time measured (two consecutive steps on a rank)."""
        return self.step.count > 0

    @property
    def coll_share(self) -> float:
        """Time in collectives as a share of the mean step time."""
        mean = self.step.mean_ms
        return self.coll_ms_per_step / mean if mean and math.isfinite(mean) else math.nan


def busy_ns(start_ns: np.ndarray, end: np.ndarray, after: int) -> tuple[int, int]:
    """(time covered by the union of the intervals [start, end) that lies past ``after``, the
    latest end): the time at least one of them ran, counting what ``after`` (the latest end of
    earlier intervals) already covered once. With starts in order (issue order, the usual
    case) an interval adds what it runs past every earlier one's end."""
    if not len(start_ns):
        return 0, after
    added, _, reach = _added(start_ns, end, after)
    return int(added.sum()), reach


def busy_split_ns(start_ns: np.ndarray, end: np.ndarray, after: int, cut: int) -> tuple[int, int, int]:
    """:func:`busy_ns` in two parts: (what intervals ``[:cut]`` add, what the rest add, the
    latest end), each interval adding what it runs past the earlier ones."""
    if not len(start_ns):
        return 0, 0, after
    added, order, reach = _added(start_ns, end, after)
    if order is not None:  # back to the intervals' own order
        own = np.empty_like(added)
        own[order] = added
        added = own
    return int(added[:cut].sum()), int(added[cut:].sum()), reach


def _added(start_ns: np.ndarray, end: np.ndarray, after: int) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(per interval, in start order, the time it runs past ``after`` and every earlier one; the
    order taken, None where the starts were in order; the latest end)."""
    start, end = np.asarray(start_ns, dtype=np.int64), np.asarray(end, dtype=np.int64)
    order = None
    if len(start) > 1 and bool((start[1:] < start[:-1]).any()):
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    before = np.empty_like(reach)
    before[0] = after
    np.maximum(reach[:-1], after, out=before[1:])
    return np.maximum(end - np.maximum(start, before), 0), order, max(after, int(reach[-1]))


def step_boundaries(
    gid: np.ndarray, step: np.ndarray, start_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For records grouped by ``gid`` (each group contiguous, in issue order): the index of each
    step's first record, and the step times (ns) with the group each belongs to."""
    n = len(step)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(step[1:], step[:-1], out=new[1:])
    new[1:] |= gid[1:] != gid[:-1]
    first = np.flatnonzero(new)
    s, t, g = step[first], start_ns[first].astype(np.int64), gid[first]
    ok = (g[1:] == g[:-1]) & (s[1:] - s[:-1] == 1)
    return first, (t[1:] - t[:-1])[ok], g[1:][ok]


class RankSteps:
    """One rank's steps, fed its batches in arrival order (ingest thread). Batches are kept as
    they come and folded FOLD_RECORDS at a time, or when read: a fixed number of numpy calls
    per fold, not per batch (a live run brings many small batches)."""

    FOLD_RECORDS = 2048
    FOLD_BATCHES = 32

    def __init__(self, times: RunAggregate | None = None) -> None:
        """``times``: where the rank's step times go: its own aggregate (None), or one shared by
        the ranks of a run (the run model's), which :func:`step_view` then reads as it is instead
        of merging one aggregate per rank (at 64 ranks that merge, folding each rank's few new
        step times, was most of a step view's ~5 ms)."""
        self.last_step: int | None = None
        self.last_start = 0
        self.first_step: int | None = None
        self.first_start = 0
        self._begun = 0
        self._times = RunAggregate() if times is None else times  # step times, us
        #: Time at least one collective ran: in steps a later step's start closed, and in the
        #: step still open (the last: a DDP join's shadow all_reduces after a rank's last batch
        #: are in it, which made collectives "116 % of a step").
        self._busy_closed_ns = 0
        self._busy_open_ns = 0
        self._reach_ns = -(2**62)  # the latest end folded so far
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_n = 0
        self.folds = 0  # folds so far (a reader of ``rate(fold=False)`` knows when it moved)
        self._recent_step = np.zeros(RECENT_STEPS, dtype=np.int64)
        self._recent_start = np.zeros(RECENT_STEPS, dtype=np.int64)
        self._recent_n = 0
        n = len(COPY_CLASSES)
        self.copy_count = np.zeros(n, dtype=np.int64)
        self.copy_bytes = np.zeros(n, dtype=np.float64)
        self.copy_us = np.zeros(n, dtype=np.float64)

    def add_coll(self, step: np.ndarray, start_ns: np.ndarray, dur_us: np.ndarray) -> None:
        if not len(step):
            return
        self._pending.append((step, start_ns, dur_us))
        self._pending_n += len(step)
        if self._pending_n >= self.FOLD_RECORDS or len(self._pending) >= self.FOLD_BATCHES:
            self._fold()

    @property
    def begun(self) -> int:
        """Steps begun (a step counts once its first collective record arrived)."""
        self._fold()
        return self._begun

    @property
    def times(self) -> RunAggregate:
        """Step times (us): this rank's, or with a shared aggregate those of every rank sharing it."""
        self._fold()
        return self._times

    @property
    def busy_us(self) -> float:
        """Time at least one collective ran (us)."""
        self._fold()
        return (self._busy_closed_ns + self._busy_open_ns) / 1e3

    @property
    def closed(self) -> tuple[int, float]:
        """(steps a later step's start closed, the time at least one collective ran in them, us):
        the time in collectives per step, over the steps whose length is known."""
        self._fold()
        return max(0, self._begun - 1), self._busy_closed_ns / 1e3

    @property
    def pending(self) -> bool:
        """Whether batches wait to be folded (``rate(fold=False)`` does not see them yet)."""
        return bool(self._pending)

    def _fold(self) -> None:
        parts = self._pending
        if not parts:
            return
        self._pending, self._pending_n = [], 0
        self.folds += 1
        if len(parts) == 1:
            step, start_ns, dur_us = parts[0]
        else:
            step, start_ns, dur_us = (np.concatenate([p[i] for p in parts]) for i in range(3))
        n = len(step)
        new = np.empty(n, dtype=bool)
        new[0] = self.last_step is None or int(step[0]) != self.last_step
        np.not_equal(step[1:], step[:-1], out=new[1:])
        first = np.flatnonzero(new)
        cut = int(first[-1]) if len(first) else n  # the newest step's first record
        closing, opened, self._reach_ns = busy_split_ns(start_ns, end_ns(start_ns, dur_us), self._reach_ns, cut)
        if not len(first):
            self._busy_open_ns += closing
            return
        self._busy_closed_ns += self._busy_open_ns + closing
        self._busy_open_ns = opened
        s, t = step[first].astype(np.int64), start_ns[first].astype(np.int64)
        if self.last_step is not None:
            prev_s = np.concatenate(([self.last_step], s[:-1]))
            prev_t = np.concatenate(([self.last_start], t[:-1]))
        else:
            prev_s, prev_t = np.concatenate(([s[0] - 2], s[:-1])), np.concatenate(([t[0]], t[:-1]))
            self.first_step, self.first_start = int(s[0]), int(t[0])
        ok = s - prev_s == 1
        if ok.any():
            self._times.add(((t - prev_t)[ok]) / 1e3)
        self._begun += len(s)
        self.last_step, self.last_start = int(s[-1]), int(t[-1])
        self._remember(s, t)

    def _remember(self, s: np.ndarray, t: np.ndarray) -> None:
        s, t = s[-RECENT_STEPS:], t[-RECENT_STEPS:]
        keep = RECENT_STEPS - len(s)
        self._recent_step[:keep] = self._recent_step[len(s) :]
        self._recent_start[:keep] = self._recent_start[len(s) :]
        self._recent_step[keep:] = s
        self._recent_start[keep:] = t
        self._recent_n = min(RECENT_STEPS, self._recent_n + len(s))

    def add_copy(self, direction: np.ndarray, pinned: np.ndarray, nbytes: np.ndarray, dur_us: np.ndarray) -> None:
        n = len(direction)
        if not n:
            return
        d0, p0 = int(direction[0]), int(pinned[0])
        if (direction == d0).all() and (pinned == p0).all():  # one direction and memory: the usual case
            i = min(d0, len(DIRECTIONS) - 1) * 2 + (p0 != 0)
            self.copy_count[i] += n
            self.copy_bytes[i] += float(nbytes.sum())
            self.copy_us[i] += float(np.sum(dur_us, dtype=np.float64))
            return
        cls = np.minimum(direction, len(DIRECTIONS) - 1).astype(np.intp) * 2 + (pinned != 0)
        k = len(COPY_CLASSES)
        self.copy_count += np.bincount(cls, minlength=k)[:k]
        self.copy_bytes += np.bincount(cls, weights=nbytes, minlength=k)[:k]
        self.copy_us += np.bincount(cls, weights=dur_us, minlength=k)[:k]

    def rate(self, *, fold: bool = True) -> float:
        """Steps per second over the newest RATE_WINDOW_S of step starts (NaN: fewer than two).
        ``fold=False``: over the steps folded so far, without folding what waits (a fold comes
        every FOLD_BATCHES batches, and with every read of a run's step view, about once a
        second live). The live rows' 5 Hz text reads it so: a fold is a fixed ~20 numpy calls,
        ~60-100 us a rank a tick, and a rate over 5 s moves little for its newest second."""
        if fold:
            self._fold()
        m = self._recent_n
        if m < 2:
            return math.nan
        s, t = self._recent_step[-m:], self._recent_start[-m:]
        i = int(np.searchsorted(t, t[-1] - int(RATE_WINDOW_S * 1e9)))
        i = min(i, m - 2)
        span = int(t[-1] - t[i])
        steps = int(s[-1] - s[i])
        return steps / (span / 1e9) if span > 0 and steps > 0 else math.nan

    def latest(self) -> int | None:
        """The newest step a collective was seen in (None: the job marks no steps)."""
        self._fold()
        return self.last_step

    def steps_per_s(self) -> float:
        """Steps per second over the whole run (first to last step start)."""
        self._fold()
        if self.first_step is None or self.last_step is None:
            return math.nan
        span = self.last_start - self.first_start
        steps = self.last_step - self.first_step
        return steps / (span / 1e9) if span > 0 and steps > 0 else math.nan


def step_view(ranks: Sequence[RankSteps], during: int = 0) -> StepView:
    """The step view of ``ranks`` pooled (``during``: their collectives during copies). Ranks
    that share one step-time aggregate (a run model's) are read through it: every rank is folded
    first (below), so it holds every rank's step times."""
    shared = ranks[0]._times if ranks and all(r._times is ranks[0]._times for r in ranks) else None
    times = RunAggregate() if shared is None else shared
    begun = closed = 0
    coll_us = 0.0
    count = np.zeros(len(COPY_CLASSES), dtype=np.int64)
    nbytes = np.zeros(len(COPY_CLASSES))
    dur = np.zeros(len(COPY_CLASSES))
    rates = []
    for r in ranks:
        if shared is None:
            times.merge(r.times)
        begun += r.begun  # (folds the rank: its step times reach a shared aggregate)
        rank_closed, rank_coll_us = r.closed
        closed += rank_closed
        coll_us += rank_coll_us
        count += r.copy_count
        nbytes += r.copy_bytes
        dur += r.copy_us
        rate = r.steps_per_s()
        if math.isfinite(rate):
            rates.append(rate)
    return StepView(
        steps=begun,
        steps_per_s=median(rates) if rates else math.nan,
        step=times.stats(),
        coll_ms_per_step=coll_us / 1e3 / closed if closed else math.nan,
        copies=copy_steps(count, nbytes, dur, begun),
        during_per_step=during / begun if begun else math.nan,
    )


def copy_steps(count: np.ndarray, nbytes: np.ndarray, dur_us: np.ndarray, steps: int) -> tuple[CopyStep, ...]:
    """Per (direction, pinned) class with copies: per step, bytes per step, GB/s."""
    out = []
    for i, (direction, pinned) in enumerate(COPY_CLASSES):
        if count[i] and steps:
            gbps = float(nbytes[i]) / float(dur_us[i]) / 1e3 if dur_us[i] > 0 else math.nan
            out.append(CopyStep(direction, pinned, int(count[i]) / steps, float(nbytes[i]) / steps, gbps))
    return tuple(out)
