"""Builds the frozen :class:`~tui.model.snapshot.Snapshot` of the run model, as cheaply as a tick
allows: what has not changed is reused.

On screen the text is rebuilt at most every TEXT_EVERY_S and the snapshots between two such
ticks only carry the new history (see SnapshotBuilder._between_ticks). A rank's numbers (window
and whole-run statistics) are recomputed only when the rank changed, and in large worlds only for
a share of the changed ranks per snapshot; whole-run statistics, clock offsets and the epochs'
comparison are reused for RUN_STATS_EVERY_S (longer in large worlds). Called on the ingest
thread, under the lock that also guards ``apply``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import numpy as np

from tui.model.epochs import EpochComparison, compare_epochs
from tui.model.history import HistoryMatrix
from tui.model.in_force import InForce, InForceTracker
from tui.model.inside import inside_of
from tui.model.job import JobInfo
from tui.model.rank_state import RankState
from tui.model.rank_totals import RankTotals
from tui.model.skew import clock_offsets, members_only, settle_iters, straggler, straggler_shares, worst_skews
from tui.model.snapshot import History, RankView, SkewEvent, Snapshot
from tui.model.stats import RunStats, pooled_stats, weighted_rate
from tui.model.steps import StepView, step_view
from tui.model.streams import StreamTable, StreamView
from tui.model.telemetry import TelemetryModel, TelemetrySnapshot
from workers.wire.protocol import MODES, Hello
from workers.wire.stats import percentiles

#: Windowed statistics (last / p50 / p99 / busbw / rate) cover this much record time.
WINDOW_S = 5.0
#: What a rank's numbers read of its collectives' window.
_VIEW_COLUMNS = ("start_ns", "dur_us", "busbw", "mode", "epoch", "stream")
#: Whole-run statistics (histogram percentiles) of a snapshot are at most this old,
#: unless the snapshot is asked for ``fresh_run_stats`` (the headless summary is).
RUN_STATS_EVERY_S = 1.0
#: The header's straggler line speaks of the iterations of the last this many seconds (the run's
#: worst arrival skew stays in the snapshot beside it).
RECENT_SKEW_S = 10.0
#: Snapshots' recent findings kept (a snapshot every ~80 ms: 10 s is ~125).
RECENT_SKEWS_KEPT = 256
#: Ranks whose epochs the verdict line compares per second of refresh interval (see _epochs).
EPOCHS_RANKS_PER_S = 128
#: Above LARGE_WORLD ranks, a rank's numbers (last/p50/p99/busbw/rate; not its history, which
#: feeds the sparklines and the heat map at every snapshot) are recomputed for at most
#: 1/REFRESH_SHARE of the ranks per snapshot (at least REFRESH_MIN while the rows are shown), the
#: longest-waiting first: every rank's numbers are then at most REFRESH_SHARE full snapshots old
#: (~6 s on screen, where a full snapshot comes every TEXT_EVERY_S; 64 ranks' rows ~1.6 s), and a
#: snapshot's cost no longer grows with the rank count (recomputing all of them was most of it).
#: Nobody reads 64 rows of numbers at 15 Hz; 16 ranks or fewer are recomputed whenever they change.
LARGE_WORLD = 16
REFRESH_SHARE = 32
REFRESH_MIN = 8
#: On screen (the ingest loop's snapshots) the text is rebuilt at most this often (a readable
#: 5 Hz: the ranks' numbers and states, the header, straggler and skew lines, the panels); the
#: sparklines and the heat map, from the history matrix, move at every snapshot. At 15 Hz that
#: spares two snapshots of three (SnapshotBuilder._between_ticks). Other callers get every change
#: at once.
TEXT_EVERY_S = 0.2

#: Snapshot or RankView (see _copy_with).
_Frozen = TypeVar("_Frozen", Snapshot, RankView)
_RunNumbers = tuple[RunStats, dict[str, RunStats], RunStats]  # whole run, per mode, copies
#: When numbers were computed: (model clock ns, wall clock s, version of the model or the rank).
_Stamp = tuple[int, float, int]


class RunState(Protocol):
    """What a snapshot is built from (:class:`tui.model.run_model.RunModel` is one)."""

    ranks: dict[int, RankState]
    rejected: dict[str, int]
    refused_ranks: int
    messages: int
    records: int
    modes_seen: set[int]
    version: int
    in_force: InForceTracker
    telemetry: TelemetryModel
    streams: StreamTable
    selected_stream: int
    interleaved: bool

    @property
    def whole_run_stats(self) -> bool: ...

    def lead_hello(self) -> Hello | None: ...

    def history_matrix(self, order: list[int]) -> HistoryMatrix: ...

    def stream_history_matrix(self, order: list[int]) -> HistoryMatrix | None: ...

    def ranks_aligned(self, world_size: int) -> bool: ...


class _Kept:
    """What the builder computed for one rank last time, and when (rank version or ns)."""

    __slots__ = ("view", "run", "classes", "steps_folds")

    def __init__(self) -> None:
        self.view: tuple[int, int, RankView] | None = None  # (rank version, computed at ns, view)
        self.run: tuple[_Stamp, _RunNumbers] | None = None  # stamped with the rank's version
        self.classes: tuple[_Stamp, dict[str, RunStats]] | None = None
        #: The rank's step folds when its view read a step rate with steps still waiting to be
        #: folded (-1: none waited): a fold since makes the view due again, as new data would.
        self.steps_folds = -1


class SnapshotBuilder:
    """Snapshots of one run model; ``reset()`` with the model."""

    def __init__(self, stale_after_ns: int, wall: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_ns = stale_after_ns
        #: A clock that always moves (the model's stands still in a paused replay); tests inject one.
        self.wall = wall
        self._run_stats_on = True  # what the last snapshot found whole_run_stats to be
        self._drawn = -1  # the stream the last snapshot's ranks' numbers were of (-1: every collective)
        self.reset()

    def reset(self) -> None:
        self._kept: dict[int, _Kept] = {}
        #: The largest arrival skew of the run so far.
        self.worst_skew: SkewEvent | None = None
        #: The run was seen to be interleaved (RunState.interleaved): the skews before are dropped once.
        self._unaligned_seen = False
        #: The largest of each snapshot's recent window (RECENT_SKEW_S), oldest first.
        self._recent_skews: deque[SkewEvent] = deque(maxlen=RECENT_SKEWS_KEPT)
        self._epochs_cache: tuple[_Stamp, int, EpochComparison | None] | None = None
        self._offsets_cache: tuple[int, tuple[str, dict[str, float]]] | None = None
        self._streams_cache: tuple[_Stamp, int, tuple[StreamView, ...]] | None = None  # (stamp, streams, views)
        self._steps_cache: tuple[_Stamp, StepView] | None = None
        #: The last full snapshot, what makes the next one full at once, and its wall clock time.
        self._ticked: tuple[Snapshot, tuple[Any, ...], float] | None = None

    def build(self, run: RunState, now: int, *, fresh_run_stats: bool = False, text_every_s: float = 0.0) -> Snapshot:
        """A frozen view of ``run`` at ``now``. Whole-run percentiles are refreshed at most every
        RUN_STATS_EVERY_S (they cost a histogram scan per rank and mode) unless ``fresh_run_stats``;
        its text at most every ``text_every_s`` (0: at every change; see _between_ticks)."""
        order = sorted(run.ranks)
        # Before the next text tick a full snapshot (something the user acts on changed) keeps
        # the ranks' numbers: only their states and what changed are new.
        hold = not self._tick_due(now, fresh_run_stats, text_every_s)
        if hold:
            between = self._between_ticks(run, order, now)
            if between is not None:
                return between
        if run.selected_stream != self._drawn or (run.whole_run_stats and not self._run_stats_on):
            # Another stream drawn, or back on: every rank's numbers count as changed, so their kept
            # views (of the stream drawn before, with whole-run statistics of when they were off)
            # are recomputed like those of a rank with news.
            hold = False
            for kept in self._kept.values():
                if kept.view is not None:
                    kept.view = (-1, *kept.view[1:])
        self._run_stats_on = run.whole_run_stats
        self._drawn = run.selected_stream
        if fresh_run_stats:  # the final summary: no copy can still come for what is pending
            for state in run.ranks.values():
                state.overlap.flush()
        history, drawn = _history(run, order)
        hellos = [s.hello for s in run.ranks.values() if s.hello]
        world_size = max((h.world_size for h in hellos), default=len(order))
        # Skew and straggler compare the k-th collective of each rank: the drawn stream's (its
        # records line up; only its group's ranks), else every collective's where all ranks issue
        # the same sequence. A job with subgroups or point-to-point has neither until a stream
        # is picked (f). Nor has a job whose ranks order their collectives differently (threads).
        all_aligned = run.ranks_aligned(world_size)
        if run.interleaved and not self._unaligned_seen:  # skews read before may compare different collectives
            self._unaligned_seen, self.worst_skew = True, None
            self._recent_skews.clear()
        if drawn is not None:
            aligned, members = members_only(history)
        else:
            aligned, members = (history if all_aligned else None), None
        a_order = order if members is None else [r for r, m in zip(order, members.tolist(), strict=True) if m]
        # Iterations every rank reported (one scan of the matrix, shared by the two below).
        complete = ~np.isnan(aligned.ms).any(axis=0) if aligned is not None and aligned.ms.shape[0] >= 2 else None
        a_shares = straggler_shares(aligned, complete) if aligned is not None else None
        shares = a_shares
        if a_shares is not None and members is not None:
            shares = np.full(len(order), np.nan)
            shares[members] = a_shares
        settle = settle_iters(run.lead_hello())
        since = now - int(RECENT_SKEW_S * 1e9)
        skew, found = (
            worst_skews(aligned, a_order, settle, complete, since_ns=since) if aligned is not None else (None, None)
        )
        if drawn is not None:  # their "iteration" is the drawn stream's call number: said so
            skew = replace(skew, stream=run.selected_stream) if skew is not None else None
            found = replace(found, stream=run.selected_stream) if found is not None else None
        if skew is not None and (self.worst_skew is None or skew.skew_ms > self.worst_skew.skew_ms):
            self.worst_skew = skew
        recent_skew = self._recent_skew(found, since)
        clock_ref, offsets = self._offsets(run, now, order, fresh_run_stats)
        due = self._due_for_refresh(run, order, now) if len(order) > LARGE_WORLD and not fresh_run_stats else None
        ranks = tuple(
            self._rank_view(
                run,
                run.ranks[r],
                now,
                shares[i] if shares is not None else math.nan,
                fresh_run_stats,
                due,
                hold,
            )
            for i, r in enumerate(order)
        )
        totals = RankTotals.of(ranks, run.ranks.values(), None if fresh_run_stats else now)
        lead = run.lead_hello()
        config = dict(lead.config) if lead else {}
        in_force = run.in_force.state()
        snap = Snapshot(
            now_ns=now,
            ranks=ranks,
            history=history,
            world_size=world_size,
            backend=lead.backend if lead else "",
            device=lead.device if lead else "",
            collective=str(config.get("collective", "")),
            shape=tuple(int(d) for d in config.get("shape", ()) if isinstance(d, int)),
            dtype=str(config.get("dtype", "")),
            tensor_bytes=int(config.get("tensor_bytes", 0) or 0),
            config=config,
            settings=in_force.settings,
            mode_in_force=in_force.mode,
            epoch_in_force=in_force.epoch,
            pending_epoch=in_force.pending_epoch,
            pending_settings=in_force.pending_settings,
            apply_at=in_force.apply_at,
            started_ns=min((h.started_ns for h in hellos), default=0),
            iter_rate=totals.iter_rate,
            step_rate=totals.step_rate,
            drops=totals.drops,
            lost=totals.lost,
            lost_batches=totals.lost_batches,
            rejected=dict(run.rejected, **({"rank": run.refused_ranks} if run.refused_ranks else {})),
            worker_rejected=sum(sum(h.rejected.values()) for h in hellos),
            messages=run.messages,
            records=run.records,
            modes_seen=tuple(MODES[m] if m < len(MODES) else str(m) for m in sorted(run.modes_seen)),
            straggler=straggler(a_shares, complete, a_order),
            worst_skew=self.worst_skew,
            recent_skew=recent_skew,
            clock_offsets_ms=offsets,
            clock_ref=clock_ref,
            telemetry=_telemetry_snapshot(run.telemetry, now, offsets),
            version=run.version,
            epochs=self._epochs(run, now, in_force.epoch, in_force.mode, fresh_run_stats),
            streams=self._streams(run, now, fresh_run_stats),
            selected_stream=run.selected_stream,
            # said only where the streams alone would let every collective be compared (a job
            # with subgroups differs at the k-th collective too, and its streams already say so)
            interleaved=run.interleaved and run.streams.ranks_aligned(world_size),
            steps=self._steps(run, ranks, now, fresh_run_stats),
            job=JobInfo.of(config),
        )
        self._ticked = (snap, self._tick_key(run, order, in_force), self.wall())
        return snap

    def _tick_due(self, now: int, fresh: bool, every_s: float) -> bool:
        """Whether this snapshot rebuilds the text: always for direct (``every_s`` 0) and fresh
        snapshots; on screen when the last full one is ``every_s`` old on either clock (the
        model's stands still in a paused or ended replay: the wall clock then lets the last
        records in)."""
        ticked = self._ticked
        if ticked is None or fresh or every_s <= 0:
            return True
        return not self._younger(now, ticked[0].now_ns, ticked[2], every_s * 1e9)

    def _between_ticks(self, run: RunState, order: list[int], now: int) -> Snapshot | None:
        """The screen's snapshot between two text ticks (None when something the user acts on
        changed): the last full snapshot with the new history (the sparklines and the heat map
        move at every snapshot), counters and telemetry. Its text (the ranks' numbers and
        states, the header's rates, straggler and skew, the streams, steps and verdict) is at
        most TEXT_EVERY_S old; a new or exited rank set, a change of the settings in force or
        pending, another stream drawn or the whole-run statistics switched make a full one at
        once.

        Why: on a machine that idles between snapshots, each distinct piece of code costs 6-40x
        its warm time the first time it runs after a wake (a 2 us numpy call ~50 us on the VM;
        benchmarks/probes/wake_tax.py), so a snapshot's cost is mostly how many different steps
        it takes; these take four (history, counters, telemetry, the tick's key) of ~40."""
        assert self._ticked is not None  # _tick_due said a full snapshot was built before
        snap, key, _ = self._ticked
        if self._tick_key(run, order, run.in_force.state()) != key:
            return None
        history, _ = _history(run, order)
        telemetry = _telemetry_snapshot(run.telemetry, now, snap.clock_offsets_ms)
        return _copy_with(
            snap,
            now_ns=now,
            history=history,
            version=run.version,
            messages=run.messages,
            records=run.records,
            telemetry=telemetry,
        )

    @staticmethod
    def _tick_key(run: RunState, order: list[int], in_force: InForce) -> tuple[Any, ...]:
        """What makes a full snapshot at once when it changes (see _between_ticks)."""
        ended = sum(1 for s in run.ranks.values() if s.bye is not None)
        return (order, ended, in_force, run.selected_stream, run.whole_run_stats, run.refused_ranks, len(run.rejected))

    def _streams(self, run: RunState, now: int, fresh: bool) -> tuple[StreamView, ...]:
        """The stream table, refreshed at most every ``_run_stats_every_ns`` (a stream's
        percentiles sort up to RunAggregate.EXACT_CAP values), at once when a stream appears, and
        once more after the data stopped changing (an ended replay shows its last records)."""
        cached = self._streams_cache
        count = run.streams.count
        if cached is not None and not fresh and cached[1] == count and self._current(run, cached[0], now):
            return cached[2]
        views = run.streams.views(float(sum(s.time_ns for s in run.ranks.values())))
        self._streams_cache = (self._stamp(run, now), count, views)
        return views

    def _steps(self, run: RunState, ranks: tuple[RankView, ...], now: int, fresh: bool) -> StepView:
        """The step view of all ranks pooled, at most every ``_run_stats_every_ns`` (it merges a
        histogram per rank), and once more after the data stopped changing."""
        cached = self._steps_cache
        if cached is not None and not fresh and self._current(run, cached[0], now):
            return cached[1]
        during = sum(st.count for v in ranks if (st := v.run_by_class.get("during copies")) is not None)
        view = step_view([s.steps for s in run.ranks.values()], during)
        self._steps_cache = (self._stamp(run, now), view)
        return view

    def _recent_skew(self, found: SkewEvent | None, since: int) -> SkewEvent | None:
        """The largest arrival skew of the iterations that started since ``since`` (the last
        RECENT_SKEW_S): the history window may hold less than that (fast collectives), so each
        snapshot's finding ``found`` is kept until it is older."""
        kept = self._recent_skews
        if found is not None and not any((e.iteration, e.stream) == (found.iteration, found.stream) for e in kept):
            kept.append(found)
        while kept and kept[0].t_ns < since:
            kept.popleft()
        fresh = [e for e in kept if e.t_ns >= since]
        return max(fresh, key=lambda e: e.skew_ms) if fresh else None

    def _offsets(self, run: RunState, now: int, order: list[int], fresh: bool) -> tuple[str, dict[str, float]]:
        """Clock offsets between hosts, re-estimated at most every RUN_STATS_EVERY_S (a median
        per host over CLOCK_ITERS iterations: 64 hosts cost ~5 ms; clocks drift far slower)."""
        cached = self._offsets_cache
        if cached is not None and not fresh and 0 <= now - cached[0] < RUN_STATS_EVERY_S * 1e9:
            return cached[1]
        result = clock_offsets(order, run.ranks, by_stream=run.interleaved)
        self._offsets_cache = (now, result)
        return result

    def _epochs(self, run: RunState, now: int, newest: int, mode: str, fresh: bool = False) -> EpochComparison | None:
        """The verdict line's comparison of the epoch in force (``newest``, the header's) with the
        one before, at most once a second (every ``ranks / EPOCHS_RANKS_PER_S`` seconds in larger
        worlds: it merges every rank's per-class histograms, ~60 ms at 512 ranks); at once when
        the epoch in force changed, and once more after the data stopped changing."""
        cached = self._epochs_cache
        if cached is not None and not fresh and cached[1] == newest and self._current(run, cached[0], now):
            return cached[2]
        states = list(run.ranks.values())
        result = compare_epochs(
            (s.overlap for s in states),
            (s.copy.view(copy=False, columns=("epoch", "nbytes", "dur_us")) for s in states),
            run.in_force.settings_of,
            newest=newest,
        )
        if result is not None and result.settling and result.other_mode == "?" and mode:
            result = replace(result, other_mode=mode)  # no settled record of it yet: the header's mode
        self._epochs_cache = (self._stamp(run, now), newest, result)
        return result

    def _stamp(self, run: RunState, now: int) -> _Stamp:
        return (now, self.wall(), run.version)

    def _current(self, run: RunState, stamp: _Stamp, now: int, version: int = -1) -> bool:
        """Whether numbers computed at ``stamp`` may be shown at ``now``: nothing changed since
        (``version``: of a rank; else the model's), or less than the refresh interval passed on
        both clocks. The model's clock alone stands still in a paused or ended replay (the
        numbers of a burst fed at one instant were then kept for ever, half of them missing)."""
        if (version if version >= 0 else run.version) == stamp[2]:
            return True
        every = _run_stats_every_ns(run)
        return self._younger(now, stamp[0], stamp[1], every)

    def _younger(self, now: int, at_ns: int, at_wall: float, every_ns: float) -> bool:
        """Whether something made at ``at_ns`` (model clock) and ``at_wall`` (the builder's wall
        clock) is younger than ``every_ns`` on both: the model's clock alone stands still in a
        paused or ended replay."""
        return 0 <= now - at_ns < every_ns and (self.wall() - at_wall) * 1e9 < every_ns

    def _rank_stamp(self, s: RankState, now: int) -> _Stamp:
        return (now, self.wall(), s.version)

    def _run_stats_current(self, run: RunState, s: RankState, stamp: _Stamp, now: int) -> bool:
        """Whether a rank's whole-run statistics stamped ``stamp`` may be reused at ``now``
        (always while they are off: the heat map shows none)."""
        return not run.whole_run_stats or self._current(run, stamp, now, s.version)

    def _behind(self, run: RunState, s: RankState, kept: _Kept, now: int) -> bool:
        """Whether the rank's kept view shows whole-run statistics older than its data that may
        now be refreshed (the rank said nothing since: its view would otherwise keep them)."""
        return any(
            part is not None and part[0][2] != s.version and not self._run_stats_current(run, s, part[0], now)
            for part in (kept.run, kept.classes)
        )

    def _kept_of(self, rank: int) -> _Kept:
        kept = self._kept.get(rank)
        if kept is None:
            kept = self._kept[rank] = _Kept()
        return kept

    def _due_for_refresh(self, run: RunState, order: list[int], now: int) -> set[int]:
        """The changed ranks whose numbers this snapshot recomputes (large worlds): the
        ``len(order) / REFRESH_SHARE`` (at least REFRESH_MIN with the rows shown) computed longest
        ago. The heat map shows none of their numbers, only the header's medians of their rates."""
        least = REFRESH_MIN if run.whole_run_stats else 1
        budget = max(least, -(-len(order) // REFRESH_SHARE))
        changed = []
        for r in order:
            kept = self._kept.get(r)
            cached = kept.view if kept is not None else None
            if kept is None or cached is None:
                changed.append((-1, r))
            elif cached[0] != run.ranks[r].version or self._behind(run, run.ranks[r], kept, now):
                changed.append((cached[1], r))
        if len(changed) > budget:
            changed.sort()
            changed = changed[:budget]
        return {r for _, r in changed}

    def _rank_view(
        self,
        run: RunState,
        s: RankState,
        now: int,
        share: float,
        fresh: bool,
        due: set[int] | None = None,
        hold: bool = False,
    ) -> RankView:
        """The rank's view, recomputed when the rank changed (with ``due``, a large world: only
        when the rank is in it; with ``hold``, not before the next text tick); state, silence
        and straggler share are always new."""
        if s.bye is not None:
            state = "exited"
        elif now - s.last_seen_ns > self.stale_after_ns:
            state = "stale"
        elif s.received == 0:
            state = "waiting"
        elif now - s.last_record_ns > self.stale_after_ns:
            state = "stalled"  # its heartbeat thread talks, its loop does not
        else:
            state = "live"
        silent = max(0.0, (now - s.last_seen_ns) / 1e9)
        idle = max(0.0, (now - s.last_record_ns) / 1e9) if s.received else 0.0
        kept = self._kept_of(s.rank)
        cached = kept.view
        reuse = False
        if cached is not None and not fresh:
            if due is not None and s.rank not in due:
                reuse = True  # a large world: not this rank's turn
            else:
                # unchanged (no new data, no step folded since its rate was read), or held until
                # the next text tick; either way not behind on whole-run statistics
                folded = kept.steps_folds >= 0 and kept.steps_folds != s.steps.folds
                reuse = ((cached[0] == s.version and not folded) or hold) and not self._behind(run, s, kept, now)
        if reuse and cached is not None:
            view = cached[2]
        else:
            view = self._compute_rank_view(run, s, kept, now, fresh)
            kept.view = (s.version, now, view)
        inside = inside_of(s.hello) if state == "stalled" else ()
        return _copy_with(view, state=state, silent_s=silent, idle_s=idle, straggler_share=share, inside=inside)

    def _run_stats(self, run: RunState, s: RankState, kept: _Kept, now: int, fresh: bool) -> _RunNumbers:
        cached = kept.run
        if cached is not None and not fresh and self._run_stats_current(run, s, cached[0], now):
            return cached[1]
        by_mode = {MODES[m] if m < len(MODES) else str(m): a.stats() for m, a in sorted(s.run_by_mode.items())}
        result = (pooled_stats(s.run_by_mode.values()), by_mode, s.copy_run.stats())
        kept.run = (self._rank_stamp(s, now), result)
        return result

    def _class_stats(self, run: RunState, s: RankState, kept: _Kept, now: int, fresh: bool) -> dict[str, RunStats]:
        cached = kept.classes
        if cached is not None and not fresh and self._run_stats_current(run, s, cached[0], now):
            return cached[1]
        stats = s.overlap.stats()
        kept.classes = (self._rank_stamp(s, now), stats)
        return stats

    def _compute_rank_view(self, run: RunState, s: RankState, kept: _Kept, now: int, fresh: bool) -> RankView:
        h = s.hello
        span = int(WINDOW_S * 1e9)
        win = s.coll.window("start_ns", span, _VIEW_COLUMNS)
        cwin = s.copy.window("start_ns", span, ("nbytes", "dur_us"))
        mode, epoch, starts = win["mode"], win["epoch"], win["start_ns"]
        rate = math.nan  # of every collective, as the count beside it
        if len(starts) > 1:
            span = int(starts[-1] - starts[0])
            rate = (len(starts) - 1) / (span / 1e9) if span > 0 else math.nan
        if run.selected_stream >= 0:  # the latency numbers of the stream the lines draw, not of a mix
            mine = win["stream"] == run.selected_stream
            win = {k: win[k][mine] for k in ("dur_us", "busbw")}
        dur = win["dur_us"]
        whole, run_by_mode, copy_run = self._run_stats(run, s, kept, now, fresh)
        p50, p99 = percentiles(dur, (50, 99))
        copy_gbps = math.nan
        if len(cwin["dur_us"]) and float(cwin["dur_us"].sum()) > 0:
            copy_gbps = float(cwin["nbytes"].sum()) / float(cwin["dur_us"].astype(np.float64).sum()) / 1e3
        gaps, lost = (s.gaps if fresh else s.settled_gaps(now)), s.lost_batches
        return RankView(
            rank=s.rank,
            host=h.host if h else "",
            gpu=("cpu" if h.device in ("", "cpu") or h.device_index < 0 else str(h.device_index)) if h else "",
            gpu_uuid=h.gpu_uuid if h else "",
            pid=h.pid if h else 0,
            exit_code=s.bye.exit_code if s.bye else None,
            exit_reason=s.bye.reason if s.bye else "",
            count=s.received,
            missing=gaps + s.lost,
            lost=s.lost,
            dropped=s.dropped,
            lost_batches=lost,
            drops=max(s.dropped, gaps),
            last_iteration=s.last_iteration,
            last_ms=float(dur[-1]) / 1e3 if len(dur) else math.nan,
            p50_ms=p50 / 1e3,
            p99_ms=p99 / 1e3,
            busbw_gbps=weighted_rate(win["busbw"], dur),
            copy_gbps=copy_gbps,
            iter_rate=rate,
            step_rate=self._step_rate(s, kept, fresh),
            mode=MODES[int(mode[-1])] if len(mode) and int(mode[-1]) < len(MODES) else "",
            epoch=int(epoch[-1]) if len(epoch) else (h.epoch if h else -1),
            run=whole,
            run_by_mode=run_by_mode,
            copy_run=copy_run,
            copies=s.copy_run.count,
            run_by_class=self._class_stats(run, s, kept, now, fresh),
            overlapped=s.overlap.overlapped(),
        )

    @staticmethod
    def _step_rate(s: RankState, kept: _Kept, fresh: bool) -> float:
        """The rank's steps/s: live, over the steps folded so far (the run's step view folds
        every rank about once a second; see RankSteps.rate), the rest at a fresh snapshot."""
        steps = s.steps
        kept.steps_folds = steps.folds if steps.pending and not fresh else -1
        return steps.rate(fold=fresh)


def _history(run: RunState, order: list[int]) -> tuple[History, HistoryMatrix | None]:
    """The history drawn (every collective's, or the selected stream's) and the stream's matrix.
    Only the drawn matrix is copied out: the other keeps its queued batches (it scatters them
    itself when PENDING_BATCHES wait) until it is drawn again."""
    drawn = run.stream_history_matrix(order)  # one stream's lines instead of every collective's
    first, ms, mode, start = (drawn if drawn is not None else run.history_matrix(order)).window()
    return History(first_iteration=first, ms=ms, mode=mode, start_ns=start), drawn


def _run_stats_every_ns(run: RunState) -> float:
    """How long a rank's whole-run statistics are reused: RUN_STATS_EVERY_S, and in large
    worlds as long as the verdict's epochs (merging histograms is most of a rank's numbers)."""
    return max(RUN_STATS_EVERY_S, len(run.ranks) / EPOCHS_RANKS_PER_S) * 1e9


def _telemetry_snapshot(telemetry: TelemetryModel, now: int, offsets_ms: dict[str, float]) -> TelemetrySnapshot:
    """Node telemetry on the reference host's clock (the offsets estimated from collectives)."""
    if not offsets_ms:
        return telemetry.snapshot(now)
    return telemetry.snapshot(now, {h: round(v * 1e6) for h, v in offsets_ms.items()})


def _copy_with(instance: _Frozen, **fields: Any) -> _Frozen:
    """A copy of a frozen dataclass instance with ``fields`` set: ``replace`` runs the dataclass
    ``__init__`` (~25 us for RankView's 32 fields, 13 ms a snapshot at 512 ranks); copying the
    instance dict costs ~1 us. Snapshots and rank views are frozen for their readers, not for
    their maker."""
    new = object.__new__(type(instance))
    new.__dict__.update(instance.__dict__)
    new.__dict__.update(fields)
    return new
