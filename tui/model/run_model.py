"""The run model: every accepted message lands here; the UI only ever sees frozen Snapshots.

Plain Python + numpy, no Textual, no torch, so the headless collector, the report and the
tests use it as is. ``RunModel.apply`` is called on the ingest thread, ``snapshot`` too;
neither is thread-safe on its own (``tui.ingest.loop.IngestLoop`` holds a lock around both).
Each rank's state is a :class:`~tui.model.rank_state.RankState`; snapshots are built by
:mod:`tui.model.snapshot_builder`.

Counting rules (per rank), chosen so nothing is counted twice:

* ``gaps``: collective iterations never received, from gaps in the ``iteration`` column
  (``last - first + 1 - received``). It includes records the worker dropped *and* records
  lost between worker and collector.
* ``lost``: collectives the rank issued and never recorded, as its Hello says (e.g. Flight
  Recorder entries overwritten before a read). ``missing`` (what users see) = gaps + lost.
* ``dropped``: the largest cumulative ``dropped`` the rank reported (batches and hellos):
  records (collective or copy) the worker could not queue.
* ``lost_batches``: batches the collector knows were sent (from ``seq`` and the hello's
  ``seq_coll``/``seq_copy``) but never received.
* ``drops`` = ``max(dropped, gaps)``. Both are lower bounds of the records this rank
  lost, so their maximum never double-counts (a sum would count a worker-side drop of a
  collective batch twice). A copy batch lost in transit shows only in ``lost_batches``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from tui.model.history import HistoryMatrix
from tui.model.in_force import InForceTracker
from tui.model.rank_state import RankState
from tui.model.snapshot import Snapshot
from tui.model.snapshot_builder import SnapshotBuilder
from tui.model.stats import RING_SIZE, RunAggregate
from tui.model.streams import NEXT_STREAM, OTHER, UNNAMED, StreamTable, record_shapes
from tui.model.telemetry import TelemetryModel
from workers.wire.protocol import COLL, TELEM, TELEM_CAPS, Batch, Bye, Hello, Message

#: A rank silent for longer than this is shown as stale (it may be stopped or hung).
STALE_AFTER_S = 2.0
#: Iterations of per-rank history handed to the UI in every snapshot (sparklines, heat map).
HISTORY_ITERS = 1024
#: Small worlds keep more iterations (up to the ring) in the chart's history, so a GPU at
#: 2000 it/s shows ~2 s instead of 0.5 s, and the links panel under it ~20 NVML ticks, not 5.
HISTORY_CELLS = 16_384
#: Most ranks the model keeps before any hello announces the world size.
MAX_RANKS = 16384

_HISTORY_COLUMNS = ("iteration", "mode", "start_ns", "dur_us", "stream", "shape")


def history_iters(n_ranks: int) -> int:
    """Iterations of history for ``n_ranks`` ranks: HISTORY_CELLS in all, HISTORY_ITERS at
    least, never more than a rank's ring holds."""
    return max(HISTORY_ITERS, min(RING_SIZE, HISTORY_CELLS // max(1, n_ranks)))


class RunModel:
    """Aggregates a run's messages into per-rank ring buffers and run-wide statistics."""

    def __init__(self, clock: Callable[[], int] = time.time_ns, stale_after_s: float = STALE_AFTER_S) -> None:
        self.clock = clock
        self.stale_after_ns = int(stale_after_s * 1e9)
        #: The settings in force; the control server reads the same tracker (one owner).
        self.in_force = InForceTracker()
        #: Whether snapshots refresh the ranks' whole-run statistics (run, per mode, per class,
        #: copies) every RUN_STATS_EVERY_S. The heat map shows none of them: while it is shown the
        #: app asks the ingest loop to turn this off, and they keep their last values (computed
        #: once at least), saving a histogram scan per rank and mode every second; back on, each
        #: rank's are refreshed the next time its numbers are (every snapshot; at most a few
        #: snapshots in large worlds). Written on the ingest thread only.
        self.whole_run_stats = True
        self._builder = SnapshotBuilder(self.stale_after_ns)
        #: The stream whose latency the history draws (its ring value; -1: every collective).
        #: Set through the ingest loop (the view asks), like ``whole_run_stats``.
        self.selected_stream = -1
        self.streams = StreamTable()
        self.reset()

    def reset(self) -> None:
        """Forget everything (a replay seeking backwards rebuilds from the start)."""
        self.ranks: dict[int, RankState] = {}
        self.rejected: dict[str, int] = {}
        self.messages = 0
        self.records = 0
        self.ignored = 0
        self.refused_ranks = 0  # messages naming a rank past the announced world size
        self._rank_limit = MAX_RANKS
        self.version = 0
        self.modes_seen: set[int] = set()
        #: The ranks x iterations history, written on apply (None: rebuilt at the next snapshot).
        self._history: HistoryMatrix | None = None
        self._stream_history: HistoryMatrix | None = None
        #: Whether the ranks' k-th collectives were seen to differ (HistoryMatrix.interleaved):
        #: kept for the run once seen, as the histories that showed it scroll away.
        self.interleaved = False
        self._stream_shapes: dict[int, int] = {}  # ring value -> its records' shape
        self.streams.reset()
        self.telemetry = TelemetryModel()
        #: Every rank's step times in one aggregate (the step view reads it whole).
        self.step_times = RunAggregate()
        self.in_force.reset()
        self._builder.reset()

    def learn_epoch_settings(self, settings: dict[int, dict[str, Any]]) -> None:
        """Settings per epoch known before the messages arrive (a replay's whole recording), so
        the header shows the settings of the epoch in force even before its first hello."""
        self.in_force.learn(settings)

    def set_rejected(self, counts: Counter[str] | dict[str, int]) -> None:
        """Frames the source refused, by reason (the source counts, the model reports)."""
        new = {str(k): int(v) for k, v in counts.items() if v}
        if new != self.rejected:
            self.rejected = new
            self.version += 1

    def _rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank, self.step_times)
        return state

    def apply(self, message: Message, now_ns: int | None = None) -> None:
        """Apply one decoded message (Batch, Hello, Bye, or a TELEM/TELEM_CAPS dict)."""
        now = self.clock() if now_ns is None else now_ns
        if isinstance(message, (Batch, Hello, Bye)):
            if self._refuse_rank(message):
                return
            self.in_force.note(message)
        if isinstance(message, Batch):
            self._apply_batch(message, now)
        elif isinstance(message, Hello):
            state = self._rank(message.rank)
            state.add_hello(message, now)
            for value, n in self.streams.named(message.rank, message):  # pending records named
                state.stream_counts[UNNAMED] -= n
                state.stream_counts[value] += n
        elif isinstance(message, Bye):
            self._rank(message.rank).add_bye(message, now)
        elif isinstance(message, dict) and message.get("k") in (TELEM, TELEM_CAPS):
            self.telemetry.apply(message)
        else:
            self.ignored += 1
            return
        self.messages += 1
        self.version += 1

    def _refuse_rank(self, message: Batch | Hello | Bye) -> bool:
        """Every rank costs ~150 KB of rings, so a signed message naming a rank past the world
        size the hellos announce (or MAX_RANKS before any hello) is refused and counted."""
        if isinstance(message, Hello) and message.rank < message.world_size <= MAX_RANKS:
            if not any(s.hello for s in self.ranks.values()):
                self._rank_limit = message.world_size
            else:
                self._rank_limit = max(self._rank_limit, message.world_size)
        if message.rank < self._rank_limit:
            return False
        self.refused_ranks += 1
        self.version += 1
        return True

    def _apply_batch(self, batch: Batch, now: int) -> None:
        state = self._rank(batch.rank)
        coll = batch.kind == COLL and len(batch) > 0
        streams, single = self.streams.add(batch.rank, state.hello, batch.columns) if coll else (None, -1)
        shapes = self._shapes(batch.columns, single) if coll else None
        before = int(state.stream_counts[self.selected_stream]) if self.selected_stream >= 0 else 0
        self.modes_seen.update(state.add_batch(batch, now, streams, single, shapes))
        self.records += len(batch)
        if coll and self._history is not None:
            c = batch.columns
            cols = {"iteration": c["iteration"], "dur_us": c["dur_us"], "mode": c["mode"], "start_ns": c["start_ns"]}
            if streams is not None and shapes is not None:
                cols["stream"], cols["shape"] = self.streams.compared(streams), shapes
            if not self._history.queue(batch.rank, cols, *state.batch_iterations):
                self.interleaved |= self._history.interleaved > 0
                self._history = None  # a rank it has no row for: rebuilt from the rings
        if coll and self._stream_history is not None and streams is not None:
            mine = streams == self.selected_stream
            if mine.any():
                cols = {k: batch.columns[k][mine] for k in ("dur_us", "mode", "start_ns")}
                cols["iteration"] = before + np.arange(len(cols["dur_us"]), dtype=np.int64)
                if not self._stream_history.add(batch.rank, cols):
                    self._stream_history = None

    def _shapes(self, columns: dict[str, np.ndarray], single: int) -> np.ndarray:
        """The records' shapes (tui.model.streams.record_shapes); a batch of one named stream (the
        usual case) takes its stream's, computed once."""
        if single < 0 or single >= OTHER:  # mixed, "other" (several shapes) or not named yet
            return record_shapes(columns)
        shape = self._stream_shapes.get(single)
        if shape is None:
            shape = self._stream_shapes[single] = int(
                record_shapes({k: columns[k][:1] for k in ("op", "dtype", "nbytes")})[0]
            )
        return np.full(len(columns["op"]), shape, dtype=np.uint16)

    def select_stream(self, value: int) -> None:
        """Draw the latency of one stream (its ring value), of every collective (-1), or of the
        stream after the one drawn now (NEXT_STREAM: the f key; presses queue up in order)."""
        if value == NEXT_STREAM:
            value = self.streams.after(self.selected_stream)
        if value != self.selected_stream:
            self.selected_stream = value
            self._stream_history = None
            self.version += 1

    def lead_hello(self) -> Hello | None:
        """The hello of rank 0, else of the lowest rank that said hello."""
        if 0 in self.ranks and self.ranks[0].hello is not None:
            return self.ranks[0].hello
        return next((s.hello for _, s in sorted(self.ranks.items()) if s.hello is not None), None)

    def history_matrix(self, order: list[int]) -> HistoryMatrix:
        """The ranks x iterations history of ``order``; rebuilt from the rings only when the set
        of ranks (and with it the width, :func:`history_iters`) changed since it was built."""
        keep = history_iters(len(order))
        matrix = self._history
        if matrix is None or matrix.width != keep or matrix.ranks != order:
            if matrix is not None:
                self.interleaved |= matrix.interleaved > 0
            matrix = self._history = _history_matrix(order, self.ranks, keep, self.streams.compared)
        return matrix

    def ranks_aligned(self, world_size: int) -> bool:
        """Whether the k-th collective of every rank is the same collective, as the history's
        iterations assume (arrival skew, straggler, clock offsets): the streams allow it
        (:meth:`StreamTable.ranks_aligned`) and no history showed two ranks' k-th collectives
        in different streams (a job issuing from several threads). Read after the history's
        window (the queued batches compared)."""
        if self._history is not None and self._history.interleaved:
            self.interleaved = True
        return not self.interleaved and self.streams.ranks_aligned(world_size)

    def stream_history_matrix(self, order: list[int]) -> HistoryMatrix | None:
        """The selected stream's ranks x occurrences history (column k: the rank's k-th record of
        the stream, aligned across ranks because every member of a group issues its collectives
        in the same order); None when no stream is selected."""
        value = self.selected_stream
        if value < 0:
            return None
        keep = history_iters(len(order))
        matrix = self._stream_history
        if matrix is None or matrix.width != keep or matrix.ranks != order:
            matrix = self._stream_history = _stream_matrix(order, self.ranks, keep, value)
        return matrix

    def snapshot(
        self, now_ns: int | None = None, *, fresh_run_stats: bool = False, text_every_s: float = 0.0
    ) -> Snapshot:
        """A frozen view of the run at ``now_ns`` (the model clock by default).

        Whole-run percentiles are refreshed at most every RUN_STATS_EVERY_S (they cost a
        histogram scan per rank and mode) unless ``fresh_run_stats``; a changed rank's numbers
        and the rest of the text at most every ``text_every_s`` (the screen's 5 Hz:
        snapshot_builder.TEXT_EVERY_S; between two such ticks only the history moves).
        """
        now = self.clock() if now_ns is None else now_ns
        return self._builder.build(self, now, fresh_run_stats=fresh_run_stats, text_every_s=text_every_s)


def _history_matrix(
    order: list[int], ranks: dict[int, RankState], keep: int, compared: Callable[[np.ndarray], np.ndarray]
) -> HistoryMatrix:
    """A history matrix for ``order``, filled from each rank's newest ``keep`` ring records
    (their streams as the history compares them: StreamTable.compared)."""
    matrix = HistoryMatrix(order, keep)
    for r in order:
        view = ranks[r].coll.view(keep, copy=False, columns=_HISTORY_COLUMNS)
        if len(view["iteration"]):
            matrix.add(r, {**view, "stream": compared(view["stream"])} if "stream" in view else view)
    return matrix


def _stream_matrix(order: list[int], ranks: dict[int, RankState], keep: int, value: int) -> HistoryMatrix:
    """The history of one stream from each rank's ring: its records there are the newest of that
    stream on the rank, so they are numbered back from the rank's count of it."""
    matrix = HistoryMatrix(order, keep)
    for r in order:
        state = ranks[r]
        view = state.coll.view(copy=False, columns=("stream", "dur_us", "mode", "start_ns"))
        mine = view["stream"] == value
        m = int(np.count_nonzero(mine))
        if m:
            total = int(state.stream_counts[value])
            cols = {k: view[k][mine] for k in ("dur_us", "mode", "start_ns")}
            cols["iteration"] = np.arange(total - m, total, dtype=np.int64)
            matrix.add(r, cols)
    return matrix
