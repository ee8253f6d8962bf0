"""The step view in `commtop report`, and the per-(epoch, rank) pass that feeds it and the
groups' stragglers.

Per settings epoch and rank (and all ranks): steps/s, step time p50/p99, time in collectives per
step, copies per step by direction and host memory, and the collectives that ran during copies
per step. The rules are :mod:`tui.model.steps`' (a step starts at its first collective on a
rank; a step time needs both steps on that rank). :class:`RunWalk` walks the (epoch, rank) runs
of the records sorted by (epoch, rank) one at a time (a rank's records come in issue order), so
its temporaries are one run's, not the recording's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from tui.model.steps import COPY_CLASSES, CopyStep, busy_ns, copy_steps, step_boundaries
from tui.recordings.summary import window_end_ns
from tui.report.kernels import _Groups
from tui.report.rows import StepRow
from workers.wire.overlap import DURING, end_ns
from workers.wire.protocol import DIRECTIONS
from workers.wire.stats import percentiles_and_max_sorted

_Epoch = tuple[int, int, int, list[tuple[int, int, int]]]
#: Records at the ends of a run that its time window is taken from (issue order is nearly
#: start order; a collective issued earlier on another stream may end a little later).
_EDGE = 64
#: Records per block of a run's busy time (int64 temporaries of 128 KB).
BUSY_BLOCK = 1 << 14


@dataclass
class GroupSteps:
    """Per rank of a group: its steps and, per step, the time and number of its collectives in
    the group (what the straggler is read from)."""

    ranks: list[int] = field(default_factory=list)
    steps: list[np.ndarray] = field(default_factory=list)
    time_us: list[np.ndarray] = field(default_factory=list)
    count: list[np.ndarray] = field(default_factory=list)

    def add(self, rank: int, steps: np.ndarray, time_us: np.ndarray, count: np.ndarray) -> None:
        self.ranks.append(rank)
        self.steps.append(steps)
        self.time_us.append(time_us)
        self.count.append(count)


@dataclass
class RunPass:
    """What the pass found, per group id (``_Groups`` ids) and per process group."""

    span_ns: np.ndarray  # the rank's time in the epoch: first start to last end
    busy_ns: np.ndarray  # the time at least one of its collectives ran, in its closed steps
    begun: np.ndarray  # steps begun
    rate: np.ndarray  # steps/s (NaN: fewer than two steps)
    times_ms: dict[int, np.ndarray]  # step times, sorted
    groups: dict[int, GroupSteps]  # by global group index
    #: steps begun less one where the run's last "step" is its collectives after the rank's last
    #: optimizer step (an eval, a barrier): what the row counts, the job's own optimizer steps
    counted: np.ndarray


#: One run's findings: (span ns, busy ns, steps begun, step times ms sorted, steps/s, per process
#: group (group, its steps, per step the time and number of its collectives), steps counted).
_RunFound = tuple[int, int, int, np.ndarray, float, list[tuple[int, np.ndarray, np.ndarray, np.ndarray]], int]


class RunWalk:
    """The pass over the (epoch, rank) runs as work any number of threads can join (:meth:`work`):
    each run is taken once, by whichever thread asks next, and :meth:`result` puts the findings
    together in run order, as one thread would. The report starts it on a side thread beside the
    epochs' sorts and joins it on the main thread once those are done (on two CPUs the pass was
    the report's longest step, with the main thread waiting on it)."""

    def __init__(
        self,
        g: _Groups,
        coll: dict[str, np.ndarray],
        dur32: np.ndarray,
        gindex: np.ndarray,
        one_group: bool,
        optimizer_steps: dict[int, int] | None = None,
    ) -> None:
        """``dur32`` is sorted by (epoch, rank), ``coll`` in file order, ``gindex`` each record's
        global group (file order; one value when ``one_group``); ``optimizer_steps``: rank ->
        the optimizer steps it said it took (its last Hello), where it said."""
        self._g, self._coll, self._dur32, self._gindex, self._one_group = g, coll, dur32, gindex, one_group
        self._optimizer_steps = optimizer_steps or {}
        self._next = itertools.count()  # next() is atomic under the GIL: each index goes to one thread
        self._found: list[_RunFound | None] = [None] * len(g.runs)

    def work(self) -> None:
        """Walk runs until none is left to take."""
        runs = self._g.runs
        while (i := next(self._next)) < len(runs):
            self._found[i] = self._one(runs[i])

    def _one(self, run: tuple[int, int, int]) -> _RunFound:
        key, a, b = run
        idx = self._g.order[a:b]
        # np.take: a third less than fancy indexing for these mostly ascending indices
        step = np.take(self._coll["step"], idx)
        start, dur = np.take(self._coll["start_ns"], idx).astype(np.int64, copy=False), self._dur32[a:b]
        span = int(window_end_ns(start[-_EDGE:], dur[-_EDGE:]).max()) - int(start[:_EDGE].min())
        first, dt, _ = step_boundaries(np.zeros(len(step), dtype=np.int8), step, start)
        cut = int(first[-1]) if len(first) else 0  # the last step, still open: no length known
        busy = _busy_of_run(start[:cut], dur[:cut])  # of the steps a later one closed
        steps_run = int(step[first[-1]] - step[first[0]])
        ns = int(start[first[-1]] - start[first[0]])
        rate = steps_run / (ns / 1e9) if steps_run > 0 and ns > 0 else math.nan
        gindex = self._gindex
        if self._one_group:
            parts = [(int(gindex[0]) if len(gindex) else 0, *_group_steps(step, dur, first))]
        else:
            gi = gindex[idx]
            parts = []
            for grp in np.flatnonzero(np.bincount(gi)).tolist():
                mine = gi == grp
                s = step[mine]
                new = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
                parts.append((grp, *_group_steps(s, dur[mine], new)))
        taken = self._optimizer_steps.get(key & 0xFFFFF, -1)
        after_last = taken >= 0 and len(first) > 0 and int(step[first[-1]]) >= taken  # no optimizer step ended it
        return span, busy, len(first), np.sort(dt) / 1e6, rate, parts, len(first) - after_last

    def result(self) -> RunPass:
        """What the pass found (every run walked: :meth:`work` has returned on some thread)."""
        g = self._g
        span = np.zeros(g.span)
        busy = np.zeros(g.span)
        begun = np.zeros(g.span, dtype=np.int64)
        counted = np.zeros(g.span, dtype=np.int64)
        rate = np.full(g.span, math.nan)
        times: dict[int, np.ndarray] = {}
        groups: dict[int, GroupSteps] = {}
        for (key, _, _), gid, found in zip(g.runs, g.ids, self._found, strict=True):
            assert found is not None, "a run was not walked"
            r_span, r_busy, r_begun, r_times, r_rate, parts, r_counted = found
            span[gid], busy[gid], begun[gid], times[gid], rate[gid] = r_span, r_busy, r_begun, r_times, r_rate
            counted[gid] = r_counted
            for grp, steps, total, counts in parts:
                groups.setdefault(grp, GroupSteps()).add(key & 0xFFFFF, steps, total, counts)
        return RunPass(span, busy, begun, rate, times, groups, counted)


def _busy_of_run(start: np.ndarray, dur: np.ndarray) -> int:
    """:func:`busy_ns` of a run's records (their ends from ``dur``), BUSY_BLOCK records at a
    time when the starts are in order (the usual case; each block carries the latest end so
    far, so the sum is the same): the temporaries then stay in cache, half the time of the
    whole run's (VM)."""
    if len(start) > 1 and bool((start[1:] < start[:-1]).any()):  # busy_ns sorts the whole run
        return busy_ns(start, end_ns(start, dur), -(2**62))[0]
    covered, after = 0, -(2**62)
    for a in range(0, len(start), BUSY_BLOCK):
        part, after = busy_ns(
            start[a : a + BUSY_BLOCK], end_ns(start[a : a + BUSY_BLOCK], dur[a : a + BUSY_BLOCK]), after
        )
        covered += part
    return covered


def _group_steps(step: np.ndarray, dur: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the steps, per step the time and number of the collectives) of one rank in one group."""
    counts = np.diff(np.append(first, len(step)))
    total = np.add.reduceat(dur.astype(np.float64), first) if len(first) else np.zeros(0)
    return step[first].astype(np.int64), total, counts


def step_rows(
    epochs: list[_Epoch],
    gid_of: dict[int, int],
    found: RunPass,
    ocls: np.ndarray,
    copies: tuple[dict[int, tuple[int, int]], dict[str, np.ndarray]],
) -> list[StepRow]:
    """Rows per epoch (all ranks, then each rank). ``ocls``: per record, sorted by (epoch,
    rank); ``copies``: the copy records' span per (epoch << 20 | rank) and their columns in
    that order."""
    out = []
    span_of, cols = copies
    for e, _, _, runs in epochs:
        ids = [gid_of[key] for key, _, _ in runs]
        members: list[tuple[int | None, list[int], list[int], int, int]] = [
            (None, ids, [key for key, _, _ in runs], runs[0][1], runs[-1][2])
        ]
        members += [(key & 0xFFFFF, [gid_of[key]], [key], a, b) for key, a, b in runs]
        for rank, gids, keys, a, b in members:
            times = np.concatenate([found.times_ms[g] for g in gids])
            if len(gids) > 1:
                times.sort()
            (p50, p99), _ = percentiles_and_max_sorted(times, [50, 99])
            steps = int(found.begun[gids].sum())
            closed = int(np.maximum(found.begun[gids] - 1, 0).sum())  # each (epoch, rank) run's last is open
            coll_ms = float(found.busy_ns[gids].sum()) / 1e6 / closed if closed else math.nan
            mean = float(times.mean()) if len(times) else math.nan
            rates = [r for r in found.rate[gids].tolist() if math.isfinite(r)]
            during = int(np.count_nonzero(ocls[a:b] == DURING)) if len(ocls) else 0
            out.append(
                StepRow(
                    epoch=e,
                    rank=rank,
                    steps=int(found.counted[gids].sum()),
                    steps_per_s=float(np.median(rates)) if rates else math.nan,
                    step_p50_ms=p50,
                    step_p99_ms=p99,
                    coll_ms_per_step=coll_ms,
                    coll_share=coll_ms / mean if mean > 0 else math.nan,
                    copies=_copies(span_of, cols, keys, steps),
                    during_per_step=during / steps if steps else math.nan,
                )
            )
    return out


def _copies(
    span_of: dict[int, tuple[int, int]], cols: dict[str, np.ndarray], keys: list[int], steps: int
) -> tuple[CopyStep, ...]:
    n = len(COPY_CLASSES)
    count, nbytes, dur = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
    for key in keys:
        a, b = span_of.get(key, (0, 0))
        if b <= a:
            continue
        cls = np.minimum(cols["direction"][a:b], len(DIRECTIONS) - 1).astype(np.intp) * 2 + (cols["pinned"][a:b] != 0)
        count += np.bincount(cls, minlength=n)[:n]
        nbytes += np.bincount(cls, weights=cols["nbytes"][a:b], minlength=n)[:n]
        dur += np.bincount(cls, weights=cols["dur_us"][a:b], minlength=n)[:n]
    return copy_steps(count, nbytes, dur, steps)
