"""What a report holds: a row per stream, settings epoch and rank, per mode, per distinct
settings, the steps, groups and ranks, and the run around them. Frozen values: the builder (:mod:`tui.report.build`) makes them, the text
(:mod:`tui.report.text`), comparisons (:mod:`tui.report.compare`) and plots read them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tui.experiment.ab_stats import ABResult
from tui.model.job import JobInfo
from tui.model.steps import CopyStep
from tui.model.streams import group_label
from tui.report.endings import Ending
from tui.report.peaks import Peaks


@dataclass(frozen=True)
class Row:
    """One stream (process group, op, dtype, size) in one epoch on one rank (``rank`` None = all
    ranks together). The fields after ``end_s`` are the epoch's on that rank (its settings,
    copies, telemetry), the same on every stream's row; ``LOOP_FIELDS`` only where the run has
    modes (the synthetic loop, or a job that declared a mode knob)."""

    epoch: int
    rank: int | None
    group: str  # the process group's name (torch's: "0", "1", ...)
    group_desc: str  # its description ("default_pg"; "" when not known)
    group_size: int
    op: str
    dtype: str  # "?" when the records do not say
    nbytes: int
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float
    algbw_gbps: float  # mean over records
    busbw_gbps: float
    total_ms: float  # time in this stream
    step_share: float  # total_ms / the ranks' time in the epoch (first record start to last end)
    start_s: float  # the epoch's window, from the start of the recording
    end_s: float
    mode: str
    copies: float | None  # per step (from the settings, else counted)
    copy_bytes: int | None
    pinned: bool | None
    direction: str
    copy_count: int
    copy_gbps: float  # mean over copies
    pcie_tx_gbps: float  # mean per GPU over the telemetry ticks of the epoch
    pcie_rx_gbps: float
    nvlink_tx_gbps: float
    nvlink_rx_gbps: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    power_w: float
    slowdown: float  # p50 / p50 of mode none (same rank and stream); NaN without a baseline
    # overlap classes (tui.report.overlap_report.class_fields)
    during_n: int = 0
    during_p50_us: float = math.nan
    during_p99_us: float = math.nan
    during_overlap: float = math.nan  # mean overlapped fraction of the collectives during copies
    after_n: int = 0
    after_p50_us: float = math.nan
    after_p99_us: float = math.nan
    none_n: int = 0
    none_p50_us: float = math.nan
    none_p99_us: float = math.nan
    # share of the link's theoretical peak (tui.report.peaks)
    copy_pct_pcie: float = math.nan
    busbw_pct_nvlink: float = math.nan
    busbw_pct_measured: float = math.nan  # of nccl-tests' busbw for this op and size (--peak)

    @property
    def group_text(self) -> str:
        return group_label(self.group, self.group_desc)


#: Row fields that describe the synthetic loop's settings and modes: left out of the table, the
#: CSV and the JSON of a run without modes (a user's job without a mode knob).
LOOP_FIELDS = ("mode", "copies", "copy_bytes", "pinned", "direction", "slowdown")


@dataclass(frozen=True)
class StepRow:
    """The step view of one epoch on one rank (``rank`` None = all ranks): tui.model.steps' rules."""

    epoch: int
    rank: int | None
    steps: int  # steps begun, less a last one after the rank's last optimizer step (its Hello says)
    steps_per_s: float  # all ranks: the median of the ranks'
    step_p50_ms: float
    step_p99_ms: float
    coll_ms_per_step: float  # time at least one collective ran, per step
    coll_share: float  # of the mean step time
    copies: tuple[CopyStep, ...]  # per (direction, pinned)
    during_per_step: float  # collectives that overlapped a copy, per step


@dataclass(frozen=True)
class GroupRow:
    """One process group over the whole recording."""

    group: str
    group_desc: str
    size: int  # as the Hellos say
    ranks: tuple[int, ...]  # ranks with records in it
    streams: int
    records: int
    #: The rank that most often spent least time in the group's collectives of a step (it
    #: arrived last: the others waited for it), if clearly so (tui.model.skew.clearly_last).
    straggler: int | None
    straggler_share: float  # of the group's complete steps that rank was last in
    steps_compared: int  # steps in which every rank of the group recorded the same collectives

    @property
    def group_text(self) -> str:
        return group_label(self.group, self.group_desc)


@dataclass(frozen=True)
class RankRow:
    """One rank over the whole recording: what is missing. ``missing`` = ``gaps`` (iterations
    never received) + ``lost`` (collectives it issued and never recorded, by its own count,
    within the recording)."""

    rank: int
    host: str
    records: int
    gaps: int
    lost: int

    @property
    def missing(self) -> int:
        return self.gaps + self.lost


@dataclass(frozen=True)
class StreamRow:
    """One stream over the whole recording, all ranks and epochs (what `report A B` compares)."""

    group: str
    group_desc: str
    group_size: int
    op: str
    dtype: str
    nbytes: int
    count: int
    p50_us: float
    p99_us: float
    max_us: float
    busbw_gbps: float
    total_ms: float
    step_share: float

    @property
    def group_text(self) -> str:
        return group_label(self.group, self.group_desc)

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.group, self.op, self.dtype, self.nbytes)


@dataclass(frozen=True)
class ModeRow:
    """Every record of one offload mode, all ranks and epochs together."""

    mode: str
    count: int
    p50_us: float
    p99_us: float
    slowdown: float
    during_p50_us: float = math.nan  # p50 per overlap class (tui.report.overlap_report)
    after_p50_us: float = math.nan
    none_p50_us: float = math.nan


@dataclass(frozen=True)
class SettingsKey:
    """Everything the workers were told to do in an epoch (what `report A B` lines up)."""

    mode: str
    copies: float | None
    copy_bytes: int | None
    pinned: bool | None
    direction: str
    knobs: str  # "name=value ..." of a monitored job's knobs; "" for the synthetic loop


@dataclass(frozen=True)
class SettingsRow:
    """All ranks of every epoch that ran with the same settings."""

    key: SettingsKey
    epochs: tuple[int, ...]
    count: int
    p50_us: float
    p99_us: float
    busbw_gbps: float  # record-weighted mean over the epochs
    copy_gbps: float  # copy-weighted mean
    during_p50_us: float = math.nan  # p50 per overlap class (tui.report.overlap_report)
    after_p50_us: float = math.nan
    none_p50_us: float = math.nan


@dataclass(frozen=True)
class Report:
    """One recording's report: the run (path, state, metadata, length) and its rows."""

    path: str
    complete: bool
    problems: str
    meta: dict[str, Any]
    duration_s: float
    records: int
    rows: tuple[Row, ...]
    modes: tuple[ModeRow, ...]
    settings: tuple[SettingsRow, ...] = ()
    ab: tuple[ABResult, ...] = ()  # each A/B experiment recorded
    peaks: Peaks = Peaks()
    #: ``--window``: the seconds of the recording reported (``duration_s`` is then their span)
    window_s: tuple[float, float] | None = None
    job: JobInfo = JobInfo()  # the synthetic loop or a user's job (tui.model.job)
    steps: tuple[StepRow, ...] = ()  # per epoch: all ranks, then each rank
    groups: tuple[GroupRow, ...] = ()
    ranks: tuple[RankRow, ...] = ()
    streams: tuple[StreamRow, ...] = ()  # over the whole recording
    ending: Ending = Ending()  # how the job ended, from its ranks' Byes

    @property
    def has_modes(self) -> bool:
        return self.job.has_modes

    @property
    def several_streams(self) -> bool:
        return len(self.streams) > 1
