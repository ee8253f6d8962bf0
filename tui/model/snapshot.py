"""What the UI sees of a run: frozen snapshots (:class:`Snapshot`, one per tick) and their parts.

Built by :mod:`tui.model.snapshot_builder` from the run model on the ingest thread, read on the
UI thread and by the headless summary; nothing here changes after it was built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tui.model.epochs import EpochComparison
from tui.model.job import JobInfo
from tui.model.stats import RunStats
from tui.model.steps import StepView
from tui.model.streams import StreamView
from tui.model.telemetry import TelemetrySnapshot
from workers.wire.settings import Settings

#: A skew event is worth a headline when the others waited this many typical collectives.
SKEW_HEADLINE_FACTOR = 2.0


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
    #: a stalled rank's blocking collective (tui.model.inside): (op, group, bytes, seconds in it)
    inside: tuple[str, str, int, float] | tuple[()] = ()
    count: int = 0  # collective records received
    missing: int = 0  # iteration gaps + lost
    lost: int = 0  # collectives the rank issued and never recorded (its own count)
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
    step_rate: float = math.nan  # steps per second (window; NaN: no steps)
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
    #: the stream drawn (its ring value) when it was found: ``iteration`` then counts that
    #: stream's calls, not the ranks' iterations (the report's and the CSV's); -1: iterations
    stream: int = -1

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
    #: The settings in force (tui.model.in_force), None until a hello, the recording or the
    #: collector told them.
    settings: Settings | None = None
    #: The mode in force ("": unknown); the records tell it before the other settings are known.
    mode_in_force: str = ""
    epoch_in_force: int = -1
    pending_epoch: int = -1
    apply_at: int = -1
    #: The settings the pending epoch brings, when a hello (or the recording) told them (None = unknown).
    pending_settings: Settings | None = None
    started_ns: int = 0
    iter_rate: float = math.nan  # median over ranks with data
    step_rate: float = math.nan  # steps per second, median over ranks with steps
    drops: int = 0
    lost: int = 0  # collectives the ranks issued and never recorded
    lost_batches: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # frames refused by the collector
    worker_rejected: int = 0  # control messages refused by workers (their hellos)
    messages: int = 0
    records: int = 0
    modes_seen: tuple[str, ...] = ()
    straggler: int | None = None  # rank most often last in recent iterations, if clearly so
    worst_skew: SkewEvent | None = None  # the largest arrival skew of the run so far
    #: The largest arrival skew of the last few seconds (the header's straggler line).
    recent_skew: SkewEvent | None = None
    #: Per host, its clock minus ``clock_ref``'s (ms), estimated from collective end times,
    #: which coincide across the ranks of one collective. Empty with one host.
    clock_offsets_ms: dict[str, float] = field(default_factory=dict)
    clock_ref: str = ""
    telemetry: TelemetrySnapshot | None = None  # node telemetry (None before any TELEM)
    version: int = 0  # model changes applied so far
    #: The two newest settings epochs compared, for the verdict line (tui.model.epochs).
    epochs: EpochComparison | None = None
    #: The run's collectives by (group, op, dtype, size), all ranks (tui.model.streams).
    streams: tuple[StreamView, ...] = ()
    #: The stream whose latency ``history`` holds (its ring value); -1: every collective.
    selected_stream: int = -1
    #: The ranks order their collectives differently although every stream spans the world
    #: (several threads issue them: a rank's k-th collective is not the others'), so ranks are
    #: compared only within one stream.
    interleaved: bool = False
    #: Steps: rate, time, collectives and copies in them (tui.model.steps).
    steps: StepView = field(default_factory=StepView)
    #: The synthetic loop or a user's job (tui.model.job).
    job: JobInfo = field(default_factory=JobInfo)

    @property
    def live_ranks(self) -> int:
        return sum(1 for r in self.ranks if r.state == "live")

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def missing(self) -> int:
        return sum(r.missing for r in self.ranks)

    @property
    def selected(self) -> StreamView | None:
        """The stream the latency lines show (None: every collective)."""
        return next((s for s in self.streams if s.index == self.selected_stream), None)
