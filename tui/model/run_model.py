"""The run model: every accepted message lands here; the UI only ever sees frozen Snapshots.

Plain Python + numpy, no Textual, no torch, so the headless collector, the report and the
tests use it as is. ``RunModel.apply`` is called on the ingest thread, ``snapshot`` too;
neither is thread-safe on its own (``tui.ingest.loop.IngestLoop`` holds a lock around both).

Counting rules (per rank), chosen so nothing is counted twice:

* ``missing``: collective iterations never received, from gaps in the ``iteration`` column
  (``last - first + 1 - received``). It includes records the worker dropped *and* records
  lost between worker and collector.
* ``dropped``: the largest cumulative ``dropped`` the rank reported (batches and hellos):
  records (collective or copy) the worker could not queue.
* ``lost_batches``: batches the collector knows were sent (from ``seq`` and the hello's
  ``seq_coll``/``seq_copy``) but never received.
* ``drops`` = ``max(dropped, missing)``. Both are lower bounds of the records this rank
  lost, so their maximum never double-counts (a sum would count a worker-side drop of a
  collective batch twice). A copy batch lost in transit shows only in ``lost_batches``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tui.model.epochs import EpochComparison, compare_epochs
from tui.model.history import HistoryMatrix
from tui.model.in_force import InForceTracker
from tui.model.overlap_live import RankOverlap
from tui.model.stats import RING_SIZE, Ring, RunAggregate, RunStats, weighted_rate
from tui.model.telemetry import TelemetryModel, TelemetrySnapshot
from workers.wire.protocol import COLL, COPY, MODES, TELEM, TELEM_CAPS, Batch, Bye, Hello, Message
from workers.wire.stats import percentiles

#: A rank silent for longer than this is shown as stale (it may be stopped or hung).
STALE_AFTER_S = 2.0
#: Windowed statistics (last / p50 / p99 / busbw / rate) cover this much record time.
WINDOW_S = 5.0
#: Iterations of per-rank history handed to the UI in every snapshot (sparklines, heat map).
HISTORY_ITERS = 1024
#: Small worlds keep more iterations (up to the ring) in the chart's history, so a GPU at
#: 2000 it/s shows ~2 s instead of 0.5 s, and the links panel under it ~20 NVML ticks, not 5.
HISTORY_CELLS = 16_384


def history_iters(n_ranks: int) -> int:
    """Iterations of history for ``n_ranks`` ranks: HISTORY_CELLS in all, HISTORY_ITERS at
    least, never more than a rank's ring holds."""
    return max(HISTORY_ITERS, min(RING_SIZE, HISTORY_CELLS // max(1, n_ranks)))


#: Iterations left out of the straggler headline when the run does not say its step length.
SETTLE_ITERS = 32
#: Complete iterations (all ranks reported) used to name the straggler.
STRAGGLER_ITERS = 256
COPY_RING_SIZE = 1024
#: Newest complete iterations searched for the worst skew at every snapshot (the worst one
#: of the run is kept; a snapshot comes every ~70 ms, so every iteration is searched many times).
SKEW_ITERS = 512
#: Recent iterations (per host pair) used to estimate clock offsets between hosts.
CLOCK_ITERS = 256
#: A skew event is worth a headline when the others waited this many typical collectives.
SKEW_HEADLINE_FACTOR = 2.0
#: Whole-run statistics (histogram percentiles) of a snapshot are at most this old,
#: unless the snapshot is asked for ``fresh_run_stats`` (the headless summary is).
RUN_STATS_EVERY_S = 1.0
#: Ranks whose epochs the verdict line compares per second of refresh interval (see _epochs).
EPOCHS_RANKS_PER_S = 128
#: Above LARGE_WORLD ranks, a rank's numbers (last/p50/p99/busbw/rate; not its history, which
#: feeds the sparklines and the heat map at every snapshot) are recomputed for at most
#: 1/REFRESH_SHARE of the ranks per snapshot (at least REFRESH_MIN), the longest-waiting first:
#: every rank's numbers are then at most REFRESH_SHARE snapshots old (~2 s at 15 Hz), and a
#: snapshot's cost no longer grows with the rank count (recomputing all of them was most of it).
#: Nobody reads 64 rows of numbers at 15 Hz; 16 ranks or fewer are recomputed whenever they change.
LARGE_WORLD = 16
REFRESH_SHARE = 32
REFRESH_MIN = 8

_COLL_RING = {"iteration": "<i8", "epoch": "<i4", "mode": "u1", "start_ns": "<i8", "dur_us": "<f4", "busbw": "<f4"}
_HISTORY_COLUMNS = ("iteration", "mode", "start_ns", "dur_us")
_COPY_RING = {"epoch": "<i4", "start_ns": "<i8", "dur_us": "<f4", "nbytes": "<i8", "gbps": "<f4"}
#: Most ranks the model keeps before any hello announces the world size.
MAX_RANKS = 16384


# --------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class RankView:
    """One rank as the UI shows it. Latencies in ms, bandwidths in GB/s, NaN = no data."""

    rank: int
    host: str = ""
    gpu: str = ""  # "0" or "cpu"; the device index on its host
    gpu_uuid: str = ""  # NVML's UUID of the rank's GPU (matches telemetry rows)
    pid: int = 0
    #: "live" | "stalled" (heartbeat alive, no collective for STALE_AFTER_S: blocked, e.g. on a
    #: stopped peer) | "stale" (nothing at all: stopped or hung process) | "exited" | "waiting"
    #: (hello but no records yet)
    state: str = "waiting"
    exit_code: int | None = None
    exit_reason: str = ""
    silent_s: float = 0.0  # seconds since the last message of this rank
    idle_s: float = 0.0  # seconds since the last collective record of this rank
    count: int = 0  # collective records received
    missing: int = 0
    dropped: int = 0
    lost_batches: int = 0
    drops: int = 0
    last_iteration: int = -1
    last_ms: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    busbw_gbps: float = math.nan
    copy_gbps: float = math.nan
    iter_rate: float = math.nan  # collectives per second (window)
    mode: str = ""  # mode of the newest record
    epoch: int = -1
    straggler_share: float = math.nan  # fraction of recent complete iterations this rank was last in
    run: RunStats = field(default_factory=RunStats)  # whole run, all modes
    run_by_mode: dict[str, RunStats] = field(default_factory=dict)
    copy_run: RunStats = field(default_factory=RunStats)  # busbw_gbps = copy GB/s
    copies: int = 0
    #: Whole run per overlap class (workers.wire.overlap.CLASSES), settled collectives only.
    run_by_class: dict[str, RunStats] = field(default_factory=dict)
    overlapped: float = math.nan  # mean overlapped fraction of the collectives during copies


@dataclass(frozen=True)
class History:
    """Per-rank collective latency by iteration, aligned across ranks (rows = ``Snapshot.ranks``).

    Column j is iteration ``first_iteration + j``; ``ms`` is NaN and ``mode`` is NO_MODE
    where a rank has no record for that iteration (not yet run, lost, or stalled).
    """

    first_iteration: int = 0
    ms: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    mode: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.uint8))
    #: Start (host wall clock, ns) of each iteration on the lowest rank that has it; 0 = none.
    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class SkewEvent:
    """One collective whose ranks arrived far apart. All ranks leave a collective together, so
    the rank that arrived last waited least: the others' latency minus its latency is the skew
    (the forum's 110 ms first all_gather after an unsynchronised offload is one of these)."""

    iteration: int
    rank: int  # arrived last (this iteration's straggler)
    skew_ms: float  # longest latency of the iteration minus the straggler's
    wait_ms: float  # longest latency of the iteration: what the earliest rank waited
    own_ms: float  # the straggler's own latency
    typical_ms: float  # median over recent iterations of their longest latency
    t_ns: int = 0  # start of the iteration (host clock of the lowest rank that has it)

    @property
    def headline(self) -> bool:
        """Worth showing: the others waited several typical collectives for this rank."""
        return self.skew_ms > SKEW_HEADLINE_FACTOR * max(self.typical_ms, 1e-3)


@dataclass(frozen=True)
class Snapshot:
    """Everything the UI draws, frozen at ``now_ns`` (host wall clock, ns)."""

    now_ns: int
    ranks: tuple[RankView, ...] = ()
    history: History = field(default_factory=History)
    world_size: int = 0
    backend: str = ""
    device: str = ""
    collective: str = ""
    shape: tuple[int, ...] = ()
    dtype: str = ""
    tensor_bytes: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # in force (rank 0's hello)
    epoch_in_force: int = -1
    pending_epoch: int = -1
    apply_at: int = -1
    #: The settings the pending epoch brings, when a hello (or the recording) told them ({} = unknown).
    pending_settings: dict[str, Any] = field(default_factory=dict)
    started_ns: int = 0
    iter_rate: float = math.nan  # median over ranks with data
    drops: int = 0
    lost_batches: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # frames refused by the collector
    worker_rejected: int = 0  # control messages refused by workers (their hellos)
    messages: int = 0
    records: int = 0
    modes_seen: tuple[str, ...] = ()
    straggler: int | None = None  # rank most often last in recent iterations, if clearly so
    worst_skew: SkewEvent | None = None  # the largest arrival skew of the run so far
    #: Per host, its clock minus ``clock_ref``'s (ms), estimated from collective end times,
    #: which coincide across the ranks of one collective. Empty with one host.
    clock_offsets_ms: dict[str, float] = field(default_factory=dict)
    clock_ref: str = ""
    telemetry: TelemetrySnapshot | None = None  # node telemetry (None before any TELEM)
    version: int = 0  # model changes applied so far
    #: The two newest settings epochs compared, for the verdict line (tui.model.epochs).
    epochs: EpochComparison | None = None

    @property
    def live_ranks(self) -> int:
        return sum(1 for r in self.ranks if r.state == "live")

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


# --------------------------------------------------------------------------- per rank


class _RankState:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.hello: Hello | None = None
        self.bye: Bye | None = None
        self.last_seen_ns = 0
        self.last_record_ns = 0  # arrival of the newest collective batch (the loop is moving)
        self.coll = Ring(_COLL_RING, RING_SIZE)
        self.copy = Ring(_COPY_RING, COPY_RING_SIZE)
        self.run_by_mode: dict[int, RunAggregate] = {}
        self.copy_run = RunAggregate()
        self.first_iteration = -1
        self.last_iteration = -1
        self.received = 0
        self.dropped = 0
        self.max_seq = {COLL: -1, COPY: -1}
        self.batches = {COLL: 0, COPY: 0}
        self.sent_hint = {COLL: 0, COPY: 0}  # batches sent so far, from the hello
        self.version = 0  # bumped by every message of this rank (snapshot caching)
        self.view_cache: tuple[int, int, RankView] | None = None  # (version, computed at ns, view)
        self.run_cache: tuple[int, tuple[RunStats, dict[str, RunStats], RunStats]] | None = None
        self.overlap = RankOverlap()
        self.class_cache: tuple[int, dict[str, RunStats]] | None = None

    @property
    def missing(self) -> int:
        if self.received == 0:
            return 0
        return max(0, self.last_iteration - self.first_iteration + 1 - self.received)

    @property
    def lost_batches(self) -> int:
        lost = 0
        for kind in (COLL, COPY):
            expected = max(self.max_seq[kind] + 1, self.sent_hint[kind])
            lost += max(0, expected - self.batches[kind])
        return lost

    def revive_if_newer(self, t_ns: int) -> None:
        """A message sent after the rank's Bye means it came back (restarted)."""
        if self.bye is not None and t_ns > self.bye.t_ns:
            self.bye = None


# --------------------------------------------------------------------------- model


class RunModel:
    """Aggregates a run's messages into per-rank ring buffers and run-wide statistics."""

    def __init__(self, clock: Callable[[], int] = time.time_ns, stale_after_s: float = STALE_AFTER_S) -> None:
        self.clock = clock
        self.stale_after_ns = int(stale_after_s * 1e9)
        #: The settings in force; the control server reads the same tracker (one owner).
        self.in_force = InForceTracker()
        #: Whether snapshots refresh the ranks' whole-run statistics (run, per mode, per class,
        #: copies) every RUN_STATS_EVERY_S. The heat map shows none of them: while it is shown the
        #: app turns this off and they keep their last values (computed once at least), saving a
        #: histogram scan per rank and mode every second; back on, each rank's are refreshed the
        #: next time its numbers are (every snapshot; at most a few snapshots in large worlds).
        self.whole_run_stats = True
        self._run_stats_on = True  # what the last snapshot found whole_run_stats to be
        self.reset()

    def reset(self) -> None:
        """Forget everything (a replay seeking backwards rebuilds from the start)."""
        self.ranks: dict[int, _RankState] = {}
        self.rejected: dict[str, int] = {}
        self.messages = 0
        self.records = 0
        self.ignored = 0
        self.refused_ranks = 0  # messages naming a rank past the announced world size
        self._rank_limit = MAX_RANKS
        self.version = 0
        self.modes_seen: set[int] = set()
        self.worst_skew: SkewEvent | None = None
        self._epochs_cache: tuple[int, EpochComparison | None] | None = None
        self._offsets_cache: tuple[int, tuple[str, dict[str, float]]] | None = None
        #: The ranks x iterations history, written on apply (None: rebuilt at the next snapshot).
        self._history: HistoryMatrix | None = None
        self.telemetry = TelemetryModel()
        self.in_force.reset()

    def _settle_iters(self) -> int:
        """Iterations of the first step: left out of the straggler headline (warm-up is not
        reported, but the first step after it still carries the ranks' start-up skew)."""
        lead = self._lead_hello()
        per_step = (lead.config.get("collectives_per_step") if lead else None) or SETTLE_ITERS
        return int(per_step) if isinstance(per_step, int) and per_step > 0 else SETTLE_ITERS

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

    def _rank(self, rank: int) -> _RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = _RankState(rank)
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
            self._apply_hello(message, now)
        elif isinstance(message, Bye):
            state = self._rank(message.rank)
            state.bye = message
            state.last_seen_ns = now
            state.version += 1
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
        state.last_seen_ns = now
        state.version += 1
        state.revive_if_newer(batch.t_ns)
        kind = batch.kind
        state.max_seq[kind] = max(state.max_seq[kind], batch.seq)
        state.batches[kind] += 1
        state.dropped = max(state.dropped, batch.dropped)
        n = len(batch)
        if n == 0:
            return
        self.records += n
        cols = batch.columns
        if kind == COLL:
            state.last_record_ns = now
            state.coll.append(cols)
            if self._history is not None and not self._history.add(batch.rank, cols):
                self._history = None  # a rank it has no row for: rebuilt from the rings
            state.overlap.add_coll(cols)
            it = cols["iteration"]
            lo, hi = int(it.min()), int(it.max())
            state.first_iteration = lo if state.first_iteration < 0 else min(state.first_iteration, lo)
            state.last_iteration = max(state.last_iteration, hi)
            state.received += n
            modes = cols["mode"]
            m_lo, m_hi = int(modes.min()), int(modes.max())
            if m_lo == m_hi:
                self._agg(state, m_lo).add(cols["dur_us"], cols["busbw"])
                self.modes_seen.add(m_lo)
            else:
                for m in np.unique(modes):
                    sel = modes == m
                    self._agg(state, int(m)).add(cols["dur_us"][sel], cols["busbw"][sel])
                    self.modes_seen.add(int(m))
        else:
            state.copy.append(cols)
            state.copy_run.add(cols["dur_us"], cols["gbps"])
            state.overlap.add_copy(cols)

    @staticmethod
    def _agg(state: _RankState, mode: int) -> RunAggregate:
        agg = state.run_by_mode.get(mode)
        if agg is None:
            agg = state.run_by_mode[mode] = RunAggregate()
        return agg

    def _apply_hello(self, hello: Hello, now: int) -> None:
        state = self._rank(hello.rank)
        state.last_seen_ns = now
        state.version += 1
        state.revive_if_newer(hello.t_ns)
        if state.hello is None or hello.t_ns >= state.hello.t_ns:
            state.hello = hello
        state.dropped = max(state.dropped, hello.dropped)
        state.sent_hint[COLL] = max(state.sent_hint[COLL], hello.seq_coll)
        state.sent_hint[COPY] = max(state.sent_hint[COPY], hello.seq_copy)

    # ----------------------------------------------------------------------- snapshot

    def snapshot(self, now_ns: int | None = None, *, fresh_run_stats: bool = False) -> Snapshot:
        """A frozen view of the run at ``now_ns`` (the model clock by default).

        Whole-run percentiles are refreshed at most every RUN_STATS_EVERY_S (they cost a
        histogram scan per rank and mode) unless ``fresh_run_stats``.
        """
        now = self.clock() if now_ns is None else now_ns
        order = sorted(self.ranks)
        if self.whole_run_stats and not self._run_stats_on:
            # Back on: every rank's numbers count as changed, so their kept views (with whole-run
            # statistics of when they were off) are recomputed like those of a rank with news.
            for state in self.ranks.values():
                if state.view_cache is not None:
                    state.view_cache = (-1, *state.view_cache[1:])
        self._run_stats_on = self.whole_run_stats
        if fresh_run_stats:  # the final summary: no copy can still come for what is pending
            for state in self.ranks.values():
                state.overlap.flush()
        history = self._history_window(order)
        # Iterations every rank reported (one scan of the matrix, shared by the two below).
        complete = ~np.isnan(history.ms).any(axis=0) if history.ms.shape[0] >= 2 else None
        shares = _straggler_shares(history, complete)
        skew = _worst_skew(history, order, self._settle_iters(), complete)
        if skew is not None and (self.worst_skew is None or skew.skew_ms > self.worst_skew.skew_ms):
            self.worst_skew = skew
        clock_ref, offsets = self._offsets(now, order, fresh_run_stats)
        due = self._due_for_refresh(order) if len(order) > LARGE_WORLD and not fresh_run_stats else None
        ranks = tuple(
            self._rank_view(self.ranks[r], now, shares[i] if shares is not None else math.nan, fresh_run_stats, due)
            for i, r in enumerate(order)
        )
        lead = self._lead_hello()
        config = dict(lead.config) if lead else {}
        rates = [v.iter_rate for v in ranks if math.isfinite(v.iter_rate)]
        in_force = self.in_force.state()
        straggler = None
        if shares is not None and len(ranks) > 1:
            best = int(np.argmax(shares))
            total = min(STRAGGLER_ITERS, int(complete.sum()) if complete is not None else 0)
            if _clearly_last(round(float(shares[best]) * total), total, len(ranks)):
                straggler = ranks[best].rank
        return Snapshot(
            now_ns=now,
            ranks=ranks,
            history=history,
            world_size=max((s.hello.world_size for s in self.ranks.values() if s.hello), default=len(order)),
            backend=lead.backend if lead else "",
            device=lead.device if lead else "",
            collective=str(config.get("collective", "")),
            shape=tuple(int(d) for d in config.get("shape", ()) if isinstance(d, int)),
            dtype=str(config.get("dtype", "")),
            tensor_bytes=int(config.get("tensor_bytes", 0) or 0),
            config=config,
            settings=in_force.settings,
            epoch_in_force=in_force.epoch,
            pending_epoch=in_force.pending_epoch,
            pending_settings=in_force.pending_settings,
            apply_at=in_force.apply_at,
            started_ns=min((s.hello.started_ns for s in self.ranks.values() if s.hello), default=0),
            iter_rate=float(np.median(rates)) if rates else math.nan,
            drops=sum(v.drops for v in ranks),
            lost_batches=sum(v.lost_batches for v in ranks),
            rejected=dict(self.rejected, **({"rank": self.refused_ranks} if self.refused_ranks else {})),
            worker_rejected=sum(sum(s.hello.rejected.values()) for s in self.ranks.values() if s.hello),
            messages=self.messages,
            records=self.records,
            modes_seen=tuple(MODES[m] if m < len(MODES) else str(m) for m in sorted(self.modes_seen)),
            straggler=straggler,
            worst_skew=self.worst_skew,
            clock_offsets_ms=offsets,
            clock_ref=clock_ref,
            telemetry=self._telemetry_snapshot(now, offsets),
            version=self.version,
            epochs=self._epochs(now, fresh_run_stats),
        )

    def _history_window(self, order: list[int]) -> History:
        """The history matrix's window; the matrix is rebuilt from the rings only when the set
        of ranks (and with it the width) changed since it was built."""
        keep = history_iters(len(order))
        matrix = self._history
        if matrix is None or matrix.width != keep or matrix.ranks != order:
            matrix = self._history = _history_matrix(order, self.ranks, keep)
        first, ms, mode, start = matrix.window()
        return History(first_iteration=first, ms=ms, mode=mode, start_ns=start)

    def _offsets(self, now: int, order: list[int], fresh: bool) -> tuple[str, dict[str, float]]:
        """Clock offsets between hosts, re-estimated at most every RUN_STATS_EVERY_S (a median
        per host over CLOCK_ITERS iterations: 64 hosts cost ~5 ms; clocks drift far slower)."""
        cached = self._offsets_cache
        if cached is not None and not fresh and 0 <= now - cached[0] < RUN_STATS_EVERY_S * 1e9:
            return cached[1]
        result = _clock_offsets(order, self.ranks)
        self._offsets_cache = (now, result)
        return result

    def _telemetry_snapshot(self, now: int, offsets_ms: dict[str, float]) -> TelemetrySnapshot:
        """Node telemetry on the reference host's clock (the offsets estimated from collectives)."""
        if not offsets_ms:
            return self.telemetry.snapshot(now)
        return self.telemetry.snapshot(now, {h: round(v * 1e6) for h, v in offsets_ms.items()})

    def _epochs(self, now: int, fresh: bool = False) -> EpochComparison | None:
        """The verdict line's comparison of the two newest epochs, at most once a second (every
        ``ranks / EPOCHS_RANKS_PER_S`` seconds in larger worlds: it merges every rank's
        per-class histograms, ~60 ms at 512 ranks)."""
        cached = self._epochs_cache
        if cached is not None and not fresh and 0 <= now - cached[0] < self._run_stats_every_ns():
            return cached[1]
        states = list(self.ranks.values())
        result = compare_epochs(
            (s.overlap for s in states),
            (s.copy.view(copy=False, columns=("epoch", "nbytes", "dur_us")) for s in states),
        )
        self._epochs_cache = (now, result)
        return result

    def _lead_hello(self) -> Hello | None:
        if 0 in self.ranks and self.ranks[0].hello is not None:
            return self.ranks[0].hello
        return next((s.hello for _, s in sorted(self.ranks.items()) if s.hello is not None), None)

    def _due_for_refresh(self, order: list[int]) -> set[int]:
        """The changed ranks whose numbers this snapshot recomputes (large worlds): the
        ``len(order) / REFRESH_SHARE`` (at least REFRESH_MIN) computed longest ago."""
        budget = max(REFRESH_MIN, -(-len(order) // REFRESH_SHARE))
        changed = []
        for r in order:
            cached = self.ranks[r].view_cache
            if cached is None:
                changed.append((-1, r))
            elif cached[0] != self.ranks[r].version:
                changed.append((cached[1], r))
        if len(changed) > budget:
            changed.sort()
            changed = changed[:budget]
        return {r for _, r in changed}

    def _rank_view(self, s: _RankState, now: int, share: float, fresh: bool, due: set[int] | None = None) -> RankView:
        """The rank's view, recomputed when the rank changed (with ``due``, a large world: only
        when the rank is in it); state, silence and straggler share are always new."""
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
        cached = s.view_cache
        if cached is not None and not fresh and (cached[0] == s.version or (due is not None and s.rank not in due)):
            view = cached[2]
        else:
            view = self._compute_rank_view(s, now, fresh)
            s.view_cache = (s.version, now, view)
        return _with_live_fields(view, state, silent, idle, share)

    def _run_stats_every_ns(self) -> float:
        """How long a rank's whole-run statistics are reused: RUN_STATS_EVERY_S, and in large
        worlds as long as the verdict's epochs (merging histograms is most of a rank's numbers)."""
        return max(RUN_STATS_EVERY_S, len(self.ranks) / EPOCHS_RANKS_PER_S) * 1e9

    def _run_stats_current(self, computed_ns: int, now: int) -> bool:
        """Whether whole-run statistics computed at ``computed_ns`` may be reused at ``now``."""
        return not self.whole_run_stats or now - computed_ns < self._run_stats_every_ns()

    def _run_stats(self, s: _RankState, now: int, fresh: bool) -> tuple[RunStats, dict[str, RunStats], RunStats]:
        cached = s.run_cache
        if cached is not None and not fresh and self._run_stats_current(cached[0], now):
            return cached[1]
        total = RunAggregate()
        for agg in s.run_by_mode.values():
            total.merge(agg)
        by_mode = {MODES[m] if m < len(MODES) else str(m): a.stats() for m, a in sorted(s.run_by_mode.items())}
        result = (total.stats(), by_mode, s.copy_run.stats())
        s.run_cache = (now, result)
        return result

    def _compute_rank_view(self, s: _RankState, now: int, fresh: bool) -> RankView:
        h = s.hello
        win = _window(s.coll.view(copy=False), "start_ns")
        cwin = _window(s.copy.view(copy=False), "start_ns")
        dur = win["dur_us"]
        rate = math.nan
        if len(dur) > 1:
            span = int(win["start_ns"][-1] - win["start_ns"][0])
            rate = (len(dur) - 1) / (span / 1e9) if span > 0 else math.nan
        run, run_by_mode, copy_run = self._run_stats(s, now, fresh)
        p50, p99 = percentiles(dur, (50, 99))
        copy_gbps = math.nan
        if len(cwin["dur_us"]) and float(cwin["dur_us"].sum()) > 0:
            copy_gbps = float(cwin["nbytes"].sum()) / float(cwin["dur_us"].astype(np.float64).sum()) / 1e3
        missing, lost = s.missing, s.lost_batches
        return RankView(
            rank=s.rank,
            host=h.host if h else "",
            gpu=("cpu" if h.device in ("", "cpu") or h.device_index < 0 else str(h.device_index)) if h else "",
            gpu_uuid=h.gpu_uuid if h else "",
            pid=h.pid if h else 0,
            exit_code=s.bye.exit_code if s.bye else None,
            exit_reason=s.bye.reason if s.bye else "",
            count=s.received,
            missing=missing,
            dropped=s.dropped,
            lost_batches=lost,
            drops=max(s.dropped, missing),
            last_iteration=s.last_iteration,
            last_ms=float(dur[-1]) / 1e3 if len(dur) else math.nan,
            p50_ms=p50 / 1e3,
            p99_ms=p99 / 1e3,
            busbw_gbps=weighted_rate(win["busbw"], dur),
            copy_gbps=copy_gbps,
            iter_rate=rate,
            mode=MODES[int(win["mode"][-1])] if len(dur) and int(win["mode"][-1]) < len(MODES) else "",
            epoch=int(win["epoch"][-1]) if len(dur) else (h.epoch if h else -1),
            run=run,
            run_by_mode=run_by_mode,
            copy_run=copy_run,
            copies=s.copy_run.count,
            run_by_class=self._class_stats(s, now, fresh),
            overlapped=s.overlap.overlapped(),
        )

    def _class_stats(self, s: _RankState, now: int, fresh: bool) -> dict[str, RunStats]:
        cached = s.class_cache
        if cached is not None and not fresh and self._run_stats_current(cached[0], now):
            return cached[1]
        stats = s.overlap.stats()
        s.class_cache = (now, stats)
        return stats


def _with_live_fields(view: RankView, state: str, silent_s: float, idle_s: float, share: float) -> RankView:
    """A copy of ``view`` with the fields that change at every snapshot set: ``replace`` runs
    the dataclass ``__init__`` (~25 us for RankView's 32 fields, 13 ms a snapshot at 512 ranks);
    copying the instance dict costs ~1 us. RankView is frozen for its readers, not for its maker."""
    new = object.__new__(RankView)
    fields = new.__dict__
    fields.update(view.__dict__)
    fields["state"], fields["silent_s"], fields["idle_s"], fields["straggler_share"] = state, silent_s, idle_s, share
    return new


def _window(view: dict[str, np.ndarray], time_col: str) -> dict[str, np.ndarray]:
    """The rows of ``view`` within WINDOW_S of its newest row (record time, not wall time)."""
    t = view[time_col]
    if len(t) == 0:
        return view
    keep = t >= t.max() - int(WINDOW_S * 1e9)
    first = int(np.argmax(keep))
    if keep[first:].all():  # records in time order (the usual case): the window is a suffix, no copies
        return {k: v[first:] for k, v in view.items()}
    return {k: v[keep] for k, v in view.items()}


def _history_matrix(order: list[int], ranks: dict[int, _RankState], keep: int) -> HistoryMatrix:
    """A history matrix for ``order``, filled from each rank's newest ``keep`` ring records."""
    matrix = HistoryMatrix(order, keep)
    for r in order:
        view = ranks[r].coll.view(keep, copy=False, columns=_HISTORY_COLUMNS)
        if len(view["iteration"]):
            matrix.add(r, view)
    return matrix


def _straggler_shares(history: History, complete: np.ndarray | None = None) -> np.ndarray | None:
    """Per rank, the share of recent complete iterations in which it arrived last.

    All ranks leave a collective together, so the rank that *arrived* last waited least:
    it has the shortest duration for that iteration.
    """
    ms = history.ms
    if ms.shape[0] < 2 or ms.shape[1] == 0:
        return None
    if complete is None:
        complete = ~np.isnan(ms).any(axis=0)
    cols = np.flatnonzero(complete)[-STRAGGLER_ITERS:]
    if len(cols) == 0:
        return None
    last_in = np.argmin(ms[:, cols], axis=0)
    return np.bincount(last_in, minlength=ms.shape[0]) / len(cols)


def _clearly_last(count: int, total: int, n: int) -> bool:
    """Was the most-often-last of ``n`` ranks last in ``count`` of ``total`` iterations far more
    often than chance? With many ranks someone is always last a few times: twice the fair
    share is noise at 64 ranks. Here the binomial upper tail (p = 1/n) must be below
    1e-4 / n (Bonferroni over the ranks), and the share at least twice the fair one (90 %
    for two ranks)."""
    if n < 2 or total == 0 or count < min(0.9, 2 / n) * total:
        return False
    p = 1.0 / n
    log_p, log_q = math.log(p), math.log1p(-p)
    head = math.lgamma(total + 1)
    tail = sum(
        math.exp(head - math.lgamma(k + 1) - math.lgamma(total - k + 1) + k * log_p + (total - k) * log_q)
        for k in range(count, total + 1)
    )
    return tail < 1e-4 / n


def _worst_skew(
    history: History, order: list[int], settle: int = 0, complete: np.ndarray | None = None
) -> SkewEvent | None:
    """The complete iteration of the history window whose ranks arrived furthest apart,
    iterations before ``settle`` left out (the first step still carries the ranks' start-up)."""
    ms = history.ms
    if ms.shape[0] < 2 or ms.shape[1] == 0:
        return None
    its = history.first_iteration + np.arange(ms.shape[1])
    if complete is None:
        complete = ~np.isnan(ms).any(axis=0)
    cols = np.flatnonzero(complete & (its >= settle))[-SKEW_ITERS:]
    if len(cols) == 0:
        return None
    sub = ms[:, cols]
    longest = sub.max(axis=0)
    skew = longest - sub.min(axis=0)
    j = int(np.argmax(skew))
    last = int(np.argmin(sub[:, j]))
    col = int(cols[j])
    return SkewEvent(
        iteration=history.first_iteration + col,
        rank=order[last],
        skew_ms=float(skew[j]),
        wait_ms=float(longest[j]),
        own_ms=float(sub[last, j]),
        typical_ms=float(np.median(longest)),
        t_ns=int(history.start_ns[col]) if len(history.start_ns) > col else 0,
    )


def _clock_offsets(order: list[int], ranks: dict[int, _RankState]) -> tuple[str, dict[str, float]]:
    """(reference host, {host: its clock minus the reference's, ms}).

    Every rank of one collective leaves it at (nearly) the same instant, so ``start + dur``
    of one iteration must coincide across ranks: the median difference between a host's
    end times and the reference host's, over the recent iterations both have, is the offset
    of its clock. The reference is the host of the lowest rank."""
    first: dict[str, int] = {}
    for r in order:
        h = ranks[r].hello
        if h is not None and h.host not in first:
            first[h.host] = r
    if len(first) < 2:
        return "", {}
    ends: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for host, r in first.items():
        v = ranks[r].coll.view(CLOCK_ITERS, copy=False)
        end = v["start_ns"] + (v["dur_us"].astype(np.float64) * 1e3).astype(np.int64)
        ends[host] = (v["iteration"], end)
    ref = ranks[order[0]].hello.host if ranks[order[0]].hello is not None else next(iter(first))  # type: ignore[union-attr]
    ref_it, ref_end = ends[ref]
    offsets: dict[str, float] = {}
    for host, (it, end) in ends.items():
        _, i, j = np.intersect1d(it, ref_it, return_indices=True)  # a restarted rank repeats iterations
        if len(i) >= 8:
            offsets[host] = float(np.median(end[i] - ref_end[j])) / 1e6
    return ref, offsets
