"""Captured collectives and copies as the rows :mod:`workers.monitor.records` batches (torch-free).

Rows get their step from the time they started: the optimizer's step hook notes
``(time_ns, step)`` at each step boundary in a :class:`StepTimeline`, and a record takes the
step in force at its host time, so a record drained seconds later still lands in its step.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from workers.capture.cupti_copies import CopyRecord
from workers.capture.fr_batch import FrBatch
from workers.monitor.records import MONITOR_COLL_ROW
from workers.rank.groups import GroupTable
from workers.wire.protocol import DIRECTIONS

#: Step boundaries kept (older records than this many steps get the oldest step known).
TIMELINE = 4096


class StepTimeline:
    """Step boundaries by time; ``mark`` runs on the job's thread (one deque append)."""

    def __init__(self, capacity: int = TIMELINE) -> None:
        self._marks: deque[tuple[int, int]] = deque(maxlen=capacity)

    def mark(self, time_ns: int, step: int) -> None:
        self._marks.append((time_ns, step))

    def snapshot(self) -> Callable[[int], int]:
        """``step_at`` over the marks as they are now: one copy (the job's thread may append
        meanwhile) for a whole batch of rows, then a bisect per row."""
        marks = list(self._marks)
        times = [t for t, _ in marks]
        steps = [s for _, s in marks]

        def step_at(time_ns: int) -> int:
            i = bisect.bisect_right(times, time_ns) - 1
            return steps[i] if i >= 0 else -1

        return step_at

    def steps_at(self, times_ns: np.ndarray) -> np.ndarray:
        """The step in force at each of ``times_ns`` (-1 before the first mark): one copy of the
        marks and one search for a whole read."""
        marks = list(self._marks)
        if not marks:
            return np.full(len(times_ns), -1, np.int64)
        times = np.fromiter((t for t, _ in marks), np.int64, len(marks))
        steps = np.fromiter((s for _, s in marks), np.int64, len(marks))
        i = np.searchsorted(times, times_ns, side="right") - 1
        return np.where(i >= 0, steps[np.maximum(i, 0)], -1)

    def step_at(self, time_ns: int) -> int:
        """The step in force at ``time_ns`` (-1 before the first mark)."""
        return self.snapshot()(time_ns)


class RowMaker:
    """Flight Recorder reads -> MONITOR_COLL_ROW records, CUPTI copies -> COPY_ROW tuples; a
    collective's group gets its code from the rank's group table (by torch's group name, as the
    monitor's wrappers key it)."""

    def __init__(self, timeline: StepTimeline, groups: GroupTable, take: Callable[[int], int] | None = None) -> None:
        self.timeline = timeline
        self.groups = groups
        self.iteration = 0  # the end of the iterations taken so far
        #: the first of n iterations (the monitor's, shared with its hooks: workers.capture.gloo_side)
        self.take = take if take is not None else self._own

    def coll_array(self, batch: FrBatch, epoch: int, mode: int) -> np.ndarray:
        """A read's collectives as MONITOR_COLL_ROW records, with no Python object per collective."""
        rows = batch.rows
        n = len(rows)
        out = np.empty(n, MONITOR_COLL_ROW)
        if not n:
            return out
        first = self.take(n)
        out["iteration"] = np.arange(first, first + n)
        self.iteration = first + n  # (the numbering only grows)
        out["step"] = self.timeline.steps_at(rows["host_ns"])
        out["epoch"] = epoch
        out["mode"] = mode
        codes = np.array([self.groups.code(*g) for g in batch.groups], MONITOR_COLL_ROW["group"])
        out["group"] = codes[rows["group"]]
        for name in ("op", "dtype", "nbytes", "ranks", "host_ns", "dur_us"):
            out[name] = rows[name]
        out["start_ns"] = rows["host_ns"]
        return out

    def _own(self, n: int) -> int:
        return self.iteration

    def copy_rows(self, cs: Iterable[CopyRecord], epoch: int) -> list[tuple[Any, ...]]:
        at = self.timeline.snapshot()
        return [self.copy_row(c, epoch, at) for c in cs]

    def copy_row(self, c: CopyRecord, epoch: int, step_at: Callable[[int], int] | None = None) -> tuple[Any, ...]:
        step = (step_at or self.timeline.step_at)(c.start_ns)
        return (step, epoch, c.nbytes, DIRECTIONS.index(c.direction), int(c.pinned), c.start_ns, c.dur_us)
