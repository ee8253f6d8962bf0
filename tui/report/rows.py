"""What a report holds: a row per settings epoch and rank, per mode, per distinct settings, and
the run around them. Frozen values: the builder (:mod:`tui.report.build`) makes them, the text
(:mod:`tui.report.text`), comparisons (:mod:`tui.report.compare`) and plots read them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tui.experiment.ab_stats import ABResult
from tui.report.peaks import Peaks


@dataclass(frozen=True)
class Row:
    """One epoch on one rank (``rank`` None = all ranks together)."""

    epoch: int
    rank: int | None
    mode: str
    copies: float | None  # per step (from the settings, else counted)
    copy_bytes: int | None
    pinned: bool | None
    direction: str
    op: str
    nbytes: int
    start_s: float  # from the start of the recording
    end_s: float
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float
    algbw_gbps: float  # mean over records
    busbw_gbps: float
    copy_count: int
    copy_gbps: float  # mean over copies
    pcie_tx_gbps: float  # mean per GPU over the telemetry ticks of the epoch
    pcie_rx_gbps: float
    nvlink_tx_gbps: float
    nvlink_rx_gbps: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    power_w: float
    slowdown: float  # p50 / p50 of mode none (same rank, op, size); NaN without a baseline
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
