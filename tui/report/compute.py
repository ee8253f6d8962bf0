"""`commtop report FILE`: what a recording says, per settings epoch and per rank.

For every epoch (mode, copies, copy size, pinned, direction) and rank: collective latency
p50/p90/p99/max, algbw/busbw, copy GB/s, PCIe/NVLink and clocks from the node telemetry in
the epoch's time window, and the slowdown against mode ``none`` (same rank, same collective
and size) in the same recording. Everything is columnar numpy over the whole file, so ten
million records take seconds. ``--format csv --records`` exports one row per collective
record (for pandas); ``--trace`` writes a Perfetto trace, ``--plot`` a PNG.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import IO, Any

import numpy as np

from tui.model.ab_stats import as_json as ab_json
from tui.model.ab_stats import format_table as ab_table
from tui.recordings import summary as chunk_summary
from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.recordings.summary import window_end_ns
from tui.recordings.writer import run_metadata
from tui.report.overlap_report import ab_sections, class_fields, class_p50s, format_class_table
from tui.report.peaks import Peaks, link_peaks, measured_lines, peak_fields, peaks_json, peaks_line
from workers.wire import protocol as p
from workers.wire.overlap import AFTER, CLASS_KEYS, DURING, NO_COPIES, classify_columns
from workers.wire.stats import percentiles, percentiles_and_max, percentiles_and_max_sorted
from workers.wire.telemetry import Tick

TRACE_WARN_BYTES = 500_000_000
REPORT_COLUMNS = ("epoch", "step", "mode", "op", "nbytes", "start_ns", "dur_us", "algbw", "busbw")
#: Tick metrics averaged over an epoch's window: the links, then clocks and power.
TICK_METRICS = (
    *p.LINK_METRICS,
    "sm_clock_mhz",
    "mem_clock_mhz",
    "power_w",
)
#: Optional tick metrics the report also reads (NaN in recordings made before them).
HBM_UTIL = "dram_bw_util_pct"
RECORD_FIELDS = (
    "rank",
    "iteration",
    "step",
    "epoch",
    "mode",
    "op",
    "nbytes",
    "host_ns",
    "start_ns",
    "dur_us",
    "algbw",
    "busbw",
    "recv_ns",
    "overlap",  # overlap class (workers.wire.overlap.CLASS_KEYS): during / after / none
    "overlapped",  # fraction of the collective's time a copy of its GPU ran
)


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
    path: str
    complete: bool
    problems: str
    meta: dict[str, Any]
    duration_s: float
    records: int
    rows: tuple[Row, ...]
    modes: tuple[ModeRow, ...]
    settings: tuple[SettingsRow, ...] = ()
    ab: tuple[Any, ...] = ()  # tui.model.ab_stats.ABResult of each A/B experiment recorded
    peaks: Peaks = Peaks()


# --------------------------------------------------------------------------- computing


def _nanmean(values: np.ndarray) -> float:
    if values.size == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(values))


def _counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, counts) of an int array; fast when there are few distinct values
    (the usual case: one collective, one size): candidates from a sample, then exact counts,
    checked to cover every element, else a full np.unique."""
    if len(values) == 0:
        return values[:0], np.zeros(0, dtype=np.int64)
    cands = np.unique(values[:: max(1, len(values) // 4096)])
    if len(cands) <= 16:
        counts = np.array([np.count_nonzero(values == c) for c in cands.tolist()], dtype=np.int64)
        if counts.sum() == len(values):
            return cands, counts
    return np.unique(values, return_counts=True)


def _mode_of(values: np.ndarray) -> int:
    uniq, counts = _counts(values)
    return int(uniq[np.argmax(counts)]) if len(uniq) else 0


def _median(d32: np.ndarray) -> float:
    """Exactly ``float(np.median(d32.astype(np.float64)))``, from the sorted float32 values."""
    return _median_sorted(np.sort(d32), d32)  # see workers.wire.stats.percentiles_and_max


def _median_sorted(part: np.ndarray, d32: np.ndarray | None = None) -> float:
    """:func:`_median` of values already sorted (``d32``: the same values in any order)."""
    n = len(part)
    lo, hi, last = part[[(n - 1) // 2, n // 2, n - 1]].astype(np.float64).tolist()
    if last != last or lo == 0 or hi == 0:
        return float(np.median((part if d32 is None else d32).astype(np.float64)))
    return lo if n % 2 else (lo + hi) / 2


def _epochs(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int, list[tuple[int, int, int]]]]:
    """(epoch, start, end, its runs) of each epoch from the (key, start, end) runs of _group."""
    out: list[tuple[int, int, int, list[tuple[int, int, int]]]] = []
    for key, a, b in runs:
        if out and out[-1][0] == key >> 20:
            out[-1] = (out[-1][0], out[-1][1], b, out[-1][3])
        else:
            out.append((key >> 20, a, b, []))
        out[-1][3].append((key, a, b))
    return out


#: Records per block for passes that need temporaries: block-sized ones are reused by the
#: allocator, where full-size ones (80 MB for 10 M int64) fault in fresh pages every time.
BLOCK = 1 << 20


@dataclass
class _Groups:
    """Records grouped by (epoch, rank): a group id per record (in file order), the stable
    permutation that makes every group contiguous, and the groups present, ascending by
    (epoch, rank), as (key = epoch << 20 | rank, start, end) in that order plus their ids."""

    gid: np.ndarray
    span: int  # group ids are < span
    order: np.ndarray
    runs: list[tuple[int, int, int]]
    ids: list[int]


def _group(epoch: np.ndarray, rank: np.ndarray) -> _Groups:
    """Few (epoch, rank) pairs (the usual case) get a dense 16-bit id, which numpy sorts with a
    radix sort; otherwise ids come from np.unique. Either way the permutation is the stable
    sort by (epoch, rank)."""
    n = len(epoch)
    if n == 0:
        return _Groups(np.zeros(0, dtype=np.uint16), 0, np.zeros(0, dtype=np.intp), [], [])
    e0, e1, r0, r1 = int(epoch.min()), int(epoch.max()), int(rank.min()), int(rank.max())
    nr = r1 - r0 + 1
    if r0 >= 0 and r1 < 1 << 20 and (e1 - e0 + 1) * nr <= 1 << 16:
        span = (e1 - e0 + 1) * nr
        gid: np.ndarray = np.empty(n, dtype=np.uint16)
        wide = np.dtype(np.int64 if max(abs(e0), abs(e1)) >= 1 << 30 else np.int32)  # no overflow below
        for a in range(0, n, BLOCK):
            e = epoch[a : a + BLOCK].astype(wide, copy=False)
            gid[a : a + BLOCK] = (e - e0) * nr + (rank[a : a + BLOCK].astype(wide, copy=False) - r0)
        counts = np.zeros(span, dtype=np.int64)
        for a in range(0, n, BLOCK):  # bincount widens to intp: a block at a time
            counts += np.bincount(gid[a : a + BLOCK], minlength=span)
        present = np.flatnonzero(counts)
        keys = [((e0 + i // nr) << 20) | (r0 + i % nr) for i in present.tolist()]
    else:
        uniq, inverse = np.unique((epoch.astype(np.int64) << 20) | rank.astype(np.int64), return_inverse=True)
        gid, span = inverse.astype(np.intp).ravel(), len(uniq)
        present, keys = np.arange(span), uniq.tolist()
        counts = np.bincount(gid, minlength=span)
    ends = np.cumsum(counts)
    ids = present.tolist()
    runs = [(key, int(ends[i] - counts[i]), int(ends[i])) for key, i in zip(keys, ids, strict=True)]
    return _Groups(gid, span, np.argsort(gid, kind="stable"), runs, ids)


def _group_sums(gid: np.ndarray, values: np.ndarray, span: int) -> np.ndarray:
    """Sum of ``values`` per group id (float64), a block at a time."""
    out = np.zeros(span)
    for a in range(0, len(gid), BLOCK):
        out += np.bincount(gid[a : a + BLOCK], weights=values[a : a + BLOCK], minlength=span)
    return out


def _epoch_windows(epoch: np.ndarray, start: np.ndarray, dur32: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per epoch: (first start, last end) in ns, end = start + duration, a block at a time."""
    out: dict[int, tuple[int, int]] = {}
    for a in range(0, len(epoch), BLOCK):
        e, s = epoch[a : a + BLOCK], start[a : a + BLOCK]
        end = window_end_ns(s, dur32[a : a + BLOCK])
        lo, hi = int(e.min()), int(e.max())
        for ep in [lo] if lo == hi else np.unique(e).tolist():
            sel = slice(None) if lo == hi else e == ep
            t0, t1 = int(s[sel].min()), int(end[sel].max())
            old = out.get(ep)
            out[ep] = (t0, t1) if old is None else (min(old[0], t0), max(old[1], t1))
    return out


def _combo_codes(op: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """A small code per record for its (op, size), and the combo ``op << 48 | size`` of each
    code; codes ascend with the combo (so ties resolve as they would on the combos)."""
    n = len(op)
    if n == 0:
        return np.zeros(0, dtype=np.uint8), []
    step = max(1, n // 4096)
    cands = sorted(set(zip(op[::step].tolist(), nbytes[::step].tolist(), strict=True)))
    if len(cands) == 1 and bool((op == cands[0][0]).all()) and bool((nbytes == cands[0][1]).all()):
        return np.zeros(n, dtype=np.uint8), [(cands[0][0] << 48) | cands[0][1]]
    if len(cands) <= 64:
        codes = np.full(n, 255, dtype=np.uint8)
        for a in range(0, n, BLOCK):
            o, b, c = op[a : a + BLOCK], nbytes[a : a + BLOCK], codes[a : a + BLOCK]
            for i, (co, cb) in enumerate(cands):
                c[(b == cb) & (o == co)] = i
        if not bool((codes == 255).any()):
            return codes, [(co << 48) | cb for co, cb in cands]
    uniq, inverse = np.unique((op.astype(np.int64) << 48) | nbytes.astype(np.int64), return_inverse=True)
    return inverse.astype(np.int32).ravel(), uniq.tolist()


class _Telemetry:
    """Node ticks as per-host arrays: times and metric[tick, gpu] matrices, GPUs by uuid."""

    def __init__(self, ticks: Sequence[tuple[int, Tick]]) -> None:
        by_host: dict[str, list[Tick]] = {}
        for _, tick in ticks:
            if tick.uuids:
                by_host.setdefault(tick.host, []).append(tick)
        self.hosts: dict[str, tuple[np.ndarray, tuple[str, ...], dict[str, np.ndarray]]] = {}
        for host, host_ticks in by_host.items():
            uuids = Counter(t.uuids for t in host_ticks).most_common(1)[0][0]
            kept = sorted((t for t in host_ticks if t.uuids == uuids), key=lambda t: t.t_ns)
            mats = {name: np.array([t.metrics[name] for t in kept]) for name in (*TICK_METRICS, HBM_UTIL)}
            self.hosts[host] = (np.array([t.t_ns for t in kept], dtype=np.int64), uuids, mats)

    def mean(self, name: str, t0: int, t1: int, gpu: tuple[str, str] | None) -> float:
        """Mean of ``name`` over ticks in [t0, t1], for one (host, uuid) or every GPU."""
        parts = []
        for host, (times, uuids, mats) in self.hosts.items():
            a, b = np.searchsorted(times, [t0, t1 + 1])
            block = mats[name][a:b]
            if gpu is not None:
                if gpu[0] != host or gpu[1] not in uuids:
                    continue
                block = block[:, uuids.index(gpu[1])]
            parts.append(block.ravel())
        return _nanmean(np.concatenate(parts)) if parts else math.nan


def _settings_by_epoch(hellos: Sequence[tuple[int, p.Hello]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for _, h in hellos:
        out.setdefault(h.epoch, dict(h.settings))
    return out


#: Run facts a recording's header may lack (recording started before any Hello) and a cut
#: file's missing trailer would have supplied; the Hellos in the data know them.
_FROM_HELLOS = (
    "ranks",
    "world_size",
    "hosts",
    "gpus",
    "backend",
    "config",
    "settings",
    "torch_version",
    "nccl_version",
)


def _meta_with_hellos(meta: dict[str, Any], hellos: Sequence[tuple[int, p.Hello]]) -> dict[str, Any]:
    """The recording's metadata, its empty run facts filled from the Hellos recorded."""
    if not hellos or all(meta.get(k) for k in _FROM_HELLOS):
        return meta
    seen = run_metadata({h.rank: h for _, h in hellos})
    return {**meta, **{k: seen[k] for k in _FROM_HELLOS if not meta.get(k) and seen.get(k)}}


def _link_tx(telemetry: _Telemetry, t0: int, t1: int) -> float:
    """Link tx GB/s per GPU over [t0, t1]: PCIe, plus NVLink where there is any (A/B results)."""
    pcie = telemetry.mean("pcie_tx_gbps", t0, t1, None)
    nvl = telemetry.mean("nvlink_tx_gbps", t0, t1, None)
    return (0.0 if math.isnan(pcie) else pcie) + nvl if math.isfinite(nvl) and nvl > 0 else pcie


def _link_means(telemetry: Any, t0: int, t1: int, gpu: Any) -> dict[str, Any]:
    return {name: telemetry.mean(name, t0, t1, gpu) for name in TICK_METRICS}


class _EpochOrder:
    """One epoch's durations sorted once, with each value's rank (index within the epoch) and
    overlap class beside it, so the epoch's, every rank's and every class's percentiles are read
    out in order instead of sorting each subset again (the report's sorts were most of its time).

    The sort key packs the float32 bits (their order is the values' order for non-negative
    finite values), the rank index and the class into one uint64; an epoch with a negative,
    NaN or infinite duration, or more than 65,535 ranks, keeps the per-subset sorts (None)."""

    def __init__(self, values: np.ndarray, rank: np.ndarray, cls: np.ndarray) -> None:
        self.values, self.rank, self.cls = values, rank, cls
        self._by_rank: tuple[np.ndarray, np.ndarray, list[int]] | None = None

    @classmethod
    def of(cls, dur32: np.ndarray, ocls: np.ndarray, sizes: list[int]) -> _EpochOrder | None:
        if not len(dur32) or len(sizes) > 0xFFFF:
            return None
        bits = np.ascontiguousarray(dur32, dtype=np.float32).view(np.uint32)
        if int(bits.max()) >= 0x7F800000:  # inf, NaN, or the sign bit set
            return None
        if len(ocls) and ocls.min() == ocls.max():  # one class (no copies, say): float32 sorts
            return cls._of_one_class(dur32, int(ocls[0]), sizes)
        rank = np.repeat(np.arange(len(sizes), dtype=np.uint64), sizes)
        keys = (bits.astype(np.uint64) << np.uint64(18)) | (rank << np.uint64(2)) | ocls.astype(np.uint64)
        keys.sort()
        values = (keys >> np.uint64(18)).astype(np.uint32).view(np.float32)
        return cls(
            values,
            ((keys >> np.uint64(2)) & np.uint64(0xFFFF)).astype(np.uint16),
            (keys & np.uint64(3)).astype(np.int8),
        )

    @classmethod
    def _of_one_class(cls, dur32: np.ndarray, ocls: int, sizes: list[int]) -> _EpochOrder:
        """:meth:`of` where every record has the same class: each rank's durations sorted as
        float32 (half the bytes of the packed keys), the epoch's merged from those runs by a
        stable sort. For non-negative finite values the float order is the order of the bits,
        so the values come out exactly as from the keys."""
        starts = np.cumsum([0, *sizes]).tolist()
        by_rank = np.empty(len(dur32), dtype=np.float32)
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            by_rank[a:b] = np.sort(dur32[a:b])
        values = by_rank.copy() if len(sizes) > 1 else by_rank
        if len(sizes) > 1:
            values.sort(kind="stable")  # merges the sorted runs
        order = cls(values, np.zeros(0, dtype=np.uint16), np.full(len(values), ocls, dtype=np.int8))
        order._by_rank = (by_rank, order.cls, starts)
        return order

    @classmethod
    def union(cls, parts: list[_EpochOrder | None]) -> _EpochOrder | None:
        """The epochs together (their ranks' indices no longer mean anything): one epoch as it
        is, several merged from their sorted runs; None if one of them has no order."""
        if not parts or any(p is None for p in parts):
            return None
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([p.values for p in parts if p is not None])
        classes = np.concatenate([p.cls for p in parts if p is not None])
        order = np.argsort(values, kind="stable")  # merges the sorted runs
        return cls(values[order], np.zeros(len(values), dtype=np.uint16), classes[order])

    def _ranks(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(values, classes) regrouped rank by rank, each rank's still in order (a stable radix
        sort on the 16-bit rank index), and where each rank starts: every rank is then a slice,
        not a pass over the whole epoch."""
        if self._by_rank is None:
            perm = np.argsort(self.rank, kind="stable")
            ends = np.cumsum(np.bincount(self.rank)).tolist()
            self._by_rank = (self.values[perm], self.cls[perm], [0, *ends])
        return self._by_rank

    def group(self, index: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """(sorted durations, {class: sorted durations}) of rank ``index``, or of the whole epoch (-1)."""
        if index < 0:
            values, cls = self.values, self.cls
        else:
            by_rank, by_rank_cls, starts = self._ranks()
            a, b = (starts[index], starts[index + 1]) if index + 1 < len(starts) else (0, 0)
            values, cls = by_rank[a:b], by_rank_cls[a:b]
        counts = np.bincount(cls, minlength=4).tolist() if len(cls) else [0, 0, 0, 0]
        return values, {
            c: values if counts[c] == len(values) else values[:0] if not counts[c] else values[cls == c]
            for c in (NO_COPIES, DURING, AFTER)
        }


def _baselines(
    runs: list[tuple[int, int, int]], mode: np.ndarray, code: np.ndarray, dur32: np.ndarray, none_mode: int
) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """({code: p50 of mode none over all ranks}, {(rank, code): p50 of mode none}), codes
    ascending, from the records grouped by (epoch, rank)."""
    parts: dict[tuple[int, int], list[np.ndarray]] = {}  # (rank, code) -> durations in mode none
    for key, a, b in runs:
        is_none = mode[a:b] == none_mode
        if not is_none.any():
            continue
        vals, their = dur32[a:b][is_none], code[a:b][is_none]
        present = _counts(their)[0].tolist()
        for k in present:
            parts.setdefault((key & 0xFFFFF, k), []).append(vals if len(present) == 1 else vals[their == k])
    base_rank: dict[tuple[int, int], float] = {}
    base_code: dict[int, float] = {}
    for k in sorted({k for _, k in parts}):
        base_code[k] = _median(np.concatenate([v for (_, kk), vs in parts.items() if kk == k for v in vs]))
        for (r, kk), vs in parts.items():
            if kk == k:
                base_rank[(r, k)] = _median(np.concatenate(vs))
    return base_code, base_rank


def _baselines_of_pure_epochs(
    epochs: list[tuple[int, int, int, list[tuple[int, int, int]]]],
    orders: dict[int, _EpochOrder],
    pure: list[tuple[int, int, int]],
    mode: np.ndarray,
    none_mode: int,
) -> tuple[dict[int, float], dict[tuple[int, int], float]] | None:
    """:func:`_baselines` read out of the epochs' sorted orders, when every record of mode none
    is in an epoch of mode none alone and one (op, size) (the usual case), else None. Also None
    where a median lands on a zero (+0 and -0 sort as equals: :func:`_median` then needs the
    values in file order)."""
    pure_starts = {a for a, _, _ in pure}
    for _, a_e, b_e, _ in epochs:
        if a_e not in pure_starts and bool((mode[a_e:b_e] == none_mode).any()):
            return None
    runs_of = {a_e: eruns for _, a_e, _, eruns in epochs}
    base_code: dict[int, float] = {}
    base_rank: dict[tuple[int, int], float] = {}
    for k in sorted({k for _, _, k in pure}):
        mine = [a for a, _, kk in pure if kk == k]
        merged = _EpochOrder.union([orders[a] for a in mine])
        assert merged is not None
        per_rank: dict[int, list[np.ndarray]] = {}
        for a in mine:
            for index, (key, _, _) in enumerate(runs_of[a]):
                per_rank.setdefault(key & 0xFFFFF, []).append(orders[a].group(index)[0])
        ranks = {r: v[0] if len(v) == 1 else np.sort(np.concatenate(v)) for r, v in per_rank.items()}
        for part in (merged.values, *ranks.values()):
            n = len(part)
            if part[(n - 1) // 2] == 0 or part[n // 2] == 0:
                return None
        base_code[k] = _median_sorted(merged.values)
        for r, part in ranks.items():
            base_rank[(r, k)] = _median_sorted(part)
    return base_code, base_rank


def report_columns(rec: Recording) -> tuple[str, ...]:
    """The collective columns the report reads from ``rec``: :data:`REPORT_COLUMNS`, less the
    step where the recording holds no copy record (only the overlap classes, which match
    collectives to their step's copies, read it)."""
    if _has_copies(rec):
        return REPORT_COLUMNS
    return tuple(c for c in REPORT_COLUMNS if c != "step")


def _has_copies(rec: Recording) -> bool:
    return any(c.copy_records for c in rec.chunks)


def summary_columns(rec: Recording) -> tuple[str, ...]:
    """The collective columns a report reads where the chunks carry summaries: those of
    :func:`report_columns` less algbw and busbw (summed in the summaries) and, without copies,
    the start times (the windows are in the summaries; only the overlap classes need them)."""
    drop = {"algbw", "busbw"} if _has_copies(rec) else {"algbw", "busbw", "start_ns"}
    return tuple(c for c in report_columns(rec) if c not in drop)


def report_tables(rec: Recording) -> Tables:
    """The tables :func:`build_report` needs: fewer columns and the summaries where the writer
    summarised its chunks (tui.recordings.summary), else the report's columns."""
    if rec.has_summaries:
        return rec.tables(coll_columns=summary_columns(rec), summary=True)
    return rec.tables(coll_columns=report_columns(rec))


@dataclass(frozen=True)
class _Sums:
    """What a report takes from sums over the records: per (epoch, rank) group id the sums of
    duration, algbw and busbw; per epoch its window (first start, last end) and (first start,
    last start); the first start of all."""

    dur: np.ndarray
    alg: np.ndarray
    bus: np.ndarray
    windows: dict[int, tuple[int, int]]
    starts: dict[int, tuple[int, int]] | None  # None: from the start_ns column (ab_sections)
    t_base: int | None


def _sums_of_columns(coll: dict[str, np.ndarray], g: _Groups) -> _Sums:
    """The same from every record's columns (blocked numpy passes)."""
    windows = _epoch_windows(coll["epoch"], coll["start_ns"], coll["dur_us"])
    dur, alg, bus = (_group_sums(g.gid, coll[name], g.span) for name in ("dur_us", "algbw", "busbw"))
    t_base = int(coll["start_ns"].min()) if len(coll["start_ns"]) else None
    return _Sums(dur, alg, bus, windows, None, t_base)


def _sums_of_summary(rows: dict[str, np.ndarray] | None, g: _Groups) -> _Sums | None:
    """The same from the chunks' summaries, or None where they do not count the very records
    read (a group missing, or a count that differs): the columns then decide."""
    if rows is None:
        return None
    per = chunk_summary.by_key(rows)
    keys = [key for key, _, _ in g.runs]
    if per["key"].tolist() != keys or per["n"].tolist() != [b - a for _, a, b in g.runs]:
        return None
    sums = {f: np.zeros(g.span) for f in chunk_summary.FLOAT_FIELDS}
    for f, out in sums.items():
        out[g.ids] = per[f]
    epochs = (per["key"] >> chunk_summary.RANK_BITS).tolist()
    windows: dict[int, tuple[int, int]] = {}
    starts: dict[int, tuple[int, int]] = {}
    for e, s0, s1, t1 in zip(epochs, per["s0"].tolist(), per["s1"].tolist(), per["t1"].tolist(), strict=True):
        w, st = windows.get(e), starts.get(e)
        windows[e] = (s0, t1) if w is None else (min(w[0], s0), max(w[1], t1))
        starts[e] = (s0, s1) if st is None else (min(st[0], s0), max(st[1], s1))
    t_base = int(per["s0"].min()) if len(keys) else None
    return _Sums(sums["d"], sums["a"], sums["b"], windows, starts, t_base)


def build_report(rec: Recording, tables: Tables | None = None, measured: Sequence[Any] = ()) -> Report:
    """Every number of the report, from a recording (``tables`` when already loaded: with the
    columns of :func:`report_columns`, or of :func:`summary_columns` and the summaries)."""
    tables = tables or report_tables(rec)
    g = _group(tables.coll["epoch"], tables.coll["rank"])
    lean = "busbw" not in tables.coll  # read with summary_columns: the sums must come from the summaries
    sums = _sums_of_summary(tables.coll_summary, g) if lean else None
    if lean and sums is None:  # summaries missing or not adding up: read the columns
        tables = rec.tables(coll_columns=report_columns(rec))
        g = _group(tables.coll["epoch"], tables.coll["rank"])  # (the chunks it takes are checked anew)
    coll, copy = tables.coll, tables.copy
    settings = _settings_by_epoch(tables.hellos)
    gpu_of = {h.rank: (h.host, h.gpu_uuid) for _, h in tables.hellos}
    telemetry = _Telemetry(tables.ticks)
    peaks = link_peaks(tables.ticks, [msg for _, msg in tables.other], measured)

    # Sorted once by (epoch, rank), only the columns that need a slice per row: durations (for
    # exact percentiles), modes and (op, size) codes. Sums per row come from the chunks'
    # summaries, or per-group sums over the columns in file order, time windows from a blocked
    # pass: no full-size temporaries. Those (numpy, without the GIL) on a second thread meanwhile.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commtop-report") as side:
        summed = side.submit(_sums_of_columns, coll, g) if sums is None else None
        order = g.order
        dur32 = coll["dur_us"][order]  # percentiles sort these (workers.wire.stats)
        if len(copy["rank"]):
            ocls, ofrac = classify_columns(coll, copy)
        else:  # what classify_columns says of collectives without copies, without reading their steps
            ocls, ofrac = np.zeros(len(dur32), dtype=np.uint8), np.zeros(len(dur32), dtype=np.float32)
        mode = coll["mode"][order]
        codes, combos = _combo_codes(coll["op"], coll["nbytes"])
        code = codes[order]
        if summed is not None:
            sums = summed.result()
    assert sums is not None
    ab = tuple(
        ab_sections(
            tables,
            ocls,
            ofrac,
            lambda t0, t1: _link_tx(telemetry, t0, t1),
            lambda t0, t1: telemetry.mean(HBM_UTIL, t0, t1, None),
            sums.starts,
        )
    )
    if len(copy["rank"]):
        ocls, ofrac = ocls[order], ofrac[order]
    dur_sum, alg_sum, bus_sum, windows = sums.dur, sums.alg, sums.bus, sums.windows
    t_base = sums.t_base if sums.t_base is not None else rec.first_ns
    gid_of = dict(zip((key for key, _, _ in g.runs), g.ids, strict=True))
    copies_by = _group(copy["epoch"], copy["rank"])
    corder, cruns = copies_by.order, copies_by.runs
    cspan = {k: (a, b) for k, a, b in cruns}
    cepoch = {e: (a, b) for e, a, b, _ in _epochs(cruns)}
    c = {name: copy[name][corder] for name in ("rank", "step", "nbytes", "direction", "pinned")}
    gbps = copy["gbps"][corder].astype(np.float64)

    # Each epoch's durations sorted once (_EpochOrder), and which epochs are of one mode and
    # one (op, size) code: their orders also give the baselines and the per-mode rows.
    epochs = _epochs(g.runs)
    orders: dict[int, _EpochOrder | None] = {}  # by the epoch's first record
    pure_epochs: dict[int, list[tuple[int, int, int]]] = {}  # mode -> its epochs of one mode and (op, size) code
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="commtop-sort") as pool:  # numpy sorts without the GIL
        sorted_epochs = list(
            pool.map(
                lambda ep: _EpochOrder.of(dur32[ep[1] : ep[2]], ocls[ep[1] : ep[2]], [b - a for _, a, b in ep[3]]),
                epochs,
            )
        )
    for (_, a_e, b_e, _), ordered in zip(epochs, sorted_epochs, strict=True):
        orders[a_e] = ordered
        if ordered is not None:
            e_modes, e_codes = mode[a_e:b_e], code[a_e:b_e]
            if e_modes.min() == e_modes.max() and e_codes.min() == e_codes.max():  # one mode, one (op, size)
                pure_epochs.setdefault(int(e_modes[0]), []).append((a_e, b_e, int(e_codes[0])))
    epoch_orders = {a: o for a, o in orders.items() if o is not None}

    # baseline: p50 of mode none, per (rank, op, size) and per (op, size) over all ranks
    none_mode = p.MODES.index("none")
    baselines = _baselines_of_pure_epochs(epochs, epoch_orders, pure_epochs.get(none_mode, []), mode, none_mode)
    if baselines is None:
        baselines = _baselines(g.runs, mode, code, dur32, none_mode)
    base_code = baselines[0]  # by code, ascending (= by combo)
    base_rank = {(r, combos[k]): v for (r, k), v in baselines[1].items()}
    base_all = {combos[k]: v for k, v in base_code.items()}

    rows: list[Row] = []
    spans: dict[SettingsKey, list[tuple[int, int, Row]]] = {}  # epochs per settings, all ranks
    for e, a_e, b_e, eruns in epochs:
        s = settings.get(e, {})
        ca, cb = cepoch.get(e, (0, 0))
        if "copies" in s:
            copies: float | None = int(s["copies"])  # a setting: an integer (CSV "5", not "5.0")
        else:  # count them: copy records per (rank, step)
            steps = len(_counts((c["rank"][ca:cb].astype(np.int64) << 40) | c["step"][ca:cb])[0])
            copies = (cb - ca) / steps if steps else 0.0
        pinned = bool(s["pinned"]) if "pinned" in s else (bool(_mode_of(c["pinned"][ca:cb])) if cb > ca else None)
        direction = str(s.get("direction", p.DIRECTIONS[_mode_of(c["direction"][ca:cb])] if cb > ca else ""))
        copy_bytes = _mode_of(c["nbytes"][ca:cb]) if cb > ca else None
        k = combos[_mode_of(code[a_e:b_e])]
        op, nbytes = k >> 48, k & ((1 << 48) - 1)
        m = _mode_of(mode[a_e:b_e])
        if m == p.MODES.index("none") and cb == ca:  # no copies ran: their settings say nothing
            copies, pinned, direction, copy_bytes = None, None, "", None
        t0, t1 = windows[e]
        ids = [gid_of[key] for key, _, _ in eruns]
        groups: list[tuple[int | None, int, int, list[int], tuple[int, int]]] = [(None, a_e, b_e, ids, (ca, cb))]
        for key, a, b in eruns:  # key = epoch << 20 | rank
            groups.append((key & 0xFFFFF, a, b, [gid_of[key]], cspan.get(key, (0, 0))))
        ordered = orders[a_e]
        for index, (rank, a, b, gids, (ga, gb)) in enumerate(groups):
            member = None if ordered is None else ordered.group(index - 1)
            if member is None:
                (p50, p90, p99), top = percentiles_and_max(dur32[a:b], [50, 90, 99])
                by_class = None
            else:
                (p50, p90, p99), top = percentiles_and_max_sorted(member[0], [50, 90, 99])
                by_class = member[1]
            n = b - a
            base = base_all.get(k) if rank is None else base_rank.get((rank, k))
            gpu = None if rank is None else gpu_of.get(rank, ("", ""))
            rows.append(
                Row(
                    epoch=e,
                    rank=rank,
                    mode=p.MODES[m] if m < len(p.MODES) else f"mode{m}",
                    copies=copies,
                    copy_bytes=copy_bytes,
                    pinned=pinned,
                    direction=direction,
                    op=p.OP_NAMES[op] if op < len(p.OP_NAMES) else f"op{op}",
                    nbytes=nbytes,
                    start_s=(t0 - t_base) / 1e9,
                    end_s=(t1 - t_base) / 1e9,
                    count=n,
                    p50_us=p50,
                    p90_us=p90,
                    p99_us=p99,
                    max_us=top,
                    mean_us=float(dur_sum[gids].sum()) / n,
                    algbw_gbps=float(alg_sum[gids].sum()) / n,
                    busbw_gbps=float(bus_sum[gids].sum()) / n,
                    copy_count=gb - ga,
                    copy_gbps=float(gbps[ga:gb].mean()) if gb > ga else math.nan,
                    slowdown=p50 / base if base else math.nan,
                    **_link_means(telemetry, t0, t1, gpu),
                    **class_fields(dur32[a:b], ocls[a:b], ofrac[a:b], by_class),
                    **peak_fields(
                        float(gbps[ga:gb].mean()) if gb > ga else math.nan,
                        float(bus_sum[gids].sum()) / n,
                        peaks,
                        p.OP_NAMES[op] if op < len(p.OP_NAMES) else "",
                        nbytes,
                    ),
                )
            )
            if rank is None:
                knobs = " ".join(f"{k}={v}" for k, v in sorted(dict(s.get("knobs") or {}).items()))
                settings_key = SettingsKey(rows[-1].mode, copies, copy_bytes, pinned, direction, knobs)
                spans.setdefault(settings_key, []).append((a_e, b_e, rows[-1]))
    by_settings = []
    for settings_key, parts_of in spans.items():
        durations = np.concatenate([dur32[a:b] for a, b, _ in parts_of])
        merged = _EpochOrder.union([epoch_orders.get(a) for a, _, _ in parts_of])
        if merged is None:
            p50, p99 = percentiles(durations, [50, 99])
            class_p50 = class_p50s(durations, np.concatenate([ocls[a:b] for a, b, _ in parts_of]))
        else:
            values, by_class = merged.group(-1)
            p50, p99 = percentiles_and_max_sorted(values, [50, 99])[0]
            during, after, none = (
                percentiles_and_max_sorted(by_class[c], [50])[0][0] for c in (DURING, AFTER, NO_COPIES)
            )
            class_p50 = (during, after, none)
        epoch_rows = [r for _, _, r in parts_of]
        by_settings.append(
            SettingsRow(
                key=settings_key,
                epochs=tuple(r.epoch for r in epoch_rows),
                count=len(durations),
                p50_us=p50,
                p99_us=p99,
                busbw_gbps=_weighted_mean([(r.busbw_gbps, r.count) for r in epoch_rows]),
                copy_gbps=_weighted_mean([(r.copy_gbps, r.copy_count) for r in epoch_rows]),
                **dict(zip(("during_p50_us", "after_p50_us", "none_p50_us"), class_p50, strict=True)),
            )
        )

    modes = []
    mcounts = np.bincount(mode) if len(mode) else np.zeros(0, dtype=np.int64)
    for m, count in enumerate(mcounts.tolist()):
        if not count:
            continue
        pure = pure_epochs.get(m, [])
        merged = _EpochOrder.union([epoch_orders[a] for a, _, _ in pure])
        if merged is not None and sum(b - a for a, b, _ in pure) == count and len({k for _, _, k in pure}) == 1:
            # Every record of this mode is in epochs sorted above, all of one (op, size).
            values, by_class = merged.group(-1)
            p50, p99 = percentiles_and_max_sorted(values, [50, 99])[0]
            base = base_code.get(pure[0][2])
            # as np.average over the one (op, size) below computes it, rounding included
            slow = float(np.average([_median_sorted(values) / base], weights=[count])) if base else math.nan
            during, after, none = (
                percentiles_and_max_sorted(by_class[c], [50])[0][0] for c in (DURING, AFTER, NO_COPIES)
            )
        else:
            sel = slice(None) if count == len(mode) else mode == m
            dm, cm = dur32[sel], code[sel]
            p50, p99 = percentiles(dm, [50, 99])
            ratios, weights = [], []  # slowdown per (op, size) with a baseline, weighted by records
            for k, base in base_code.items():
                both = cm == k
                if both.any():
                    ratios.append(_median(dm[both]) / base)
                    weights.append(int(np.count_nonzero(both)))
            slow = float(np.average(ratios, weights=weights)) if ratios else math.nan
            during, after, none = class_p50s(dm, ocls[sel])
        modes.append(
            ModeRow(p.MODES[m] if m < len(p.MODES) else f"mode{m}", count, p50, p99, slow, during, after, none)
        )
    return Report(
        path=rec.path,
        complete=rec.complete,
        problems=rec.summary(),
        meta=_meta_with_hellos(rec.meta, tables.hellos),
        duration_s=(rec.last_ns - rec.first_ns) / 1e9,
        records=len(dur32),
        rows=tuple(rows),
        modes=tuple(modes),
        ab=ab,
        peaks=peaks,
        settings=tuple(by_settings),
    )


def _weighted_mean(pairs: Sequence[tuple[float, int]]) -> float:
    """Mean of per-epoch means weighted by their counts, over the finite ones."""
    ok = [(v, n) for v, n in pairs if n > 0 and math.isfinite(v)]
    total = sum(n for _, n in ok)
    return sum(v * n for v, n in ok) / total if total else math.nan


# --------------------------------------------------------------------------- output


def fmt_num(x: float | None, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return fmt.format(x)


def _pair(a: float, b: float) -> str:
    if not (math.isfinite(a) or math.isfinite(b)):
        return "n/a"
    return f"{fmt_num(a)}/{fmt_num(b)}"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"


def aligned_table(
    head: Sequence[str], body: Sequence[Sequence[str]], groups: Sequence[Any], left: set[int]
) -> list[str]:
    """Columns padded to their widest cell (``left`` ones left-aligned, the rest right), a
    blank line where ``groups`` (one value per body row) changes."""
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    lines = [fmt(head)]
    for i, row in enumerate(body):
        if i and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(fmt(row))
    if not body:
        lines.append("  (no collective records)")
    return lines


def format_table(report: Report) -> str:
    meta = report.meta
    lines = [
        f"commtop report: {report.path}",
        f"  {report.records:,} collective records over {report.duration_s:.1f} s; "
        f"ranks {len(meta.get('ranks') or [])} on {', '.join(meta.get('hosts') or ['?'])}; "
        f"commtop {meta.get('tool_version', '?')}, schema {meta.get('schema_version', '?')}",
    ]
    if report.problems:
        lines.append(f"  warning: {report.problems}")
    head = (
        "epoch",
        "mode",
        "copies",
        "size",
        "pin",
        "dir",
        "rank",
        "n",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "algbw",
        "busbw",
        "copy GB/s",
        "PCIe tx/rx",
        "NVLink tx/rx",
        "SM MHz",
        "power W",
        "slowdown",
    )
    body = []
    for r in report.rows:
        body.append(
            (
                str(r.epoch),
                r.mode,
                "-" if r.copies is None else fmt_num(r.copies, "{:g}"),
                fmt_bytes(r.copy_bytes),
                "-" if r.pinned is None else ("yes" if r.pinned else "no"),
                r.direction or "-",
                "all" if r.rank is None else str(r.rank),
                str(r.count),
                fmt_num(r.p50_us / 1e3, "{:.3f}"),
                fmt_num(r.p90_us / 1e3, "{:.3f}"),
                fmt_num(r.p99_us / 1e3, "{:.3f}"),
                fmt_num(r.max_us / 1e3, "{:.3f}"),
                fmt_num(r.algbw_gbps),
                fmt_num(r.busbw_gbps),
                fmt_num(r.copy_gbps),
                _pair(r.pcie_tx_gbps, r.pcie_rx_gbps),
                _pair(r.nvlink_tx_gbps, r.nvlink_rx_gbps),
                fmt_num(r.sm_clock_mhz, "{:.0f}"),
                fmt_num(r.power_w, "{:.0f}"),
                fmt_num(r.slowdown, "{:.2f}x"),
            )
        )
    lines += ["", *aligned_table(head, body, [r.epoch for r in report.rows], left={1, 5})]
    if report.modes:
        lines += ["", "per mode (all ranks)   n        p50 ms    p99 ms   slowdown vs none"]
        for m in report.modes:
            lines.append(
                f"  {m.mode:18} {m.count:>9}  {fmt_num(m.p50_us / 1e3, '{:.3f}'):>8}  {fmt_num(m.p99_us / 1e3, '{:.3f}'):>8}"
                f"   {fmt_num(m.slowdown, '{:.2f}x')}"
            )
    lines += format_class_table(report.rows)
    for result in report.ab:
        lines += ["", *ab_table(result, report.peaks.copy_share(result.copy_gbps[1])).splitlines()]
    lines.append("")
    lines += footnote(str(meta.get("backend") or ""))
    lines.append(peaks_line(report.peaks))
    lines += measured_lines(report.peaks, report.rows)
    return "\n".join(lines) + "\n"


def footnote(backend: str) -> list[str]:
    """How the numbers were measured: CUDA events on a GPU run, the host clock on gloo/CPU."""
    if backend.startswith("nccl") or "cuda" in backend:
        return [
            "latency = collective duration per rank (GPU time: CUPTI records, or CUDA events on the GPU); algbw/busbw GB/s as nccl-tests;",
            "PCIe/NVLink GB/s, SM clock and power = mean per GPU of the node telemetry during the epoch",
        ]
    return [
        f"latency = collective duration per rank (host clock around each call: {backend or 'no GPU'}); "
        "algbw/busbw GB/s as nccl-tests;",
        "no GPU: no PCIe/NVLink, clock or power telemetry (n/a)",
    ]


def json_clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_clean(v) for v in value]
    if isinstance(value, bytes):
        return None
    if isinstance(value, np.generic):
        return json_clean(value.item())
    return value


def format_json(report: Report) -> str:
    meta_keys = ("tool_version", "schema_version", "clock", "ranks", "world_size", "hosts", "gpus", "config", "backend")
    doc = {
        "path": report.path,
        "complete": report.complete,
        "problems": report.problems,
        "duration_s": report.duration_s,
        "records": report.records,
        "meta": {k: report.meta.get(k) for k in meta_keys},
        "rows": [asdict(r) for r in report.rows],
        "modes": [asdict(m) for m in report.modes],
        "ab": [ab_json(result) for result in report.ab],
        "peaks": peaks_json(report.peaks),
    }
    return json.dumps(json_clean(doc), indent=1) + "\n"


def format_csv(report: Report) -> str:
    out = io.StringIO()
    names = list(Row.__dataclass_fields__)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for r in report.rows:
        values = asdict(r)
        # rank is empty on the all-ranks rows: one type per column (pandas reads it as a number)
        writer.writerow([_csv_value(values[n]) for n in names])
    return out.getvalue()


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


def write_records_csv(tables: Tables, out: IO[str], block: int = 100_000) -> int:
    """One row per collective record; floats with 9 significant digits (exact for float32)."""
    coll = tables.coll
    out.write(",".join(RECORD_FIELDS) + "\n")
    names = np.array(list(p.MODES) + ["?"] * (256 - len(p.MODES)), dtype=object)
    ops = np.array(list(p.OP_NAMES) + [f"op{i}" for i in range(len(p.OP_NAMES), 256)], dtype=object)
    fmt = "%d,%d,%d,%d,%s,%s,%d,%d,%d,%.9g,%.9g,%.9g,%d,%s,%.4g\n"
    n = len(coll["dur_us"])
    ocls, ofrac = classify_columns(coll, tables.copy)
    classes = np.array(CLASS_KEYS, dtype=object)
    for a in range(0, n, block):
        s = slice(a, a + block)
        cols = (
            coll["rank"][s].tolist(),
            coll["iteration"][s].tolist(),
            coll["step"][s].tolist(),
            coll["epoch"][s].tolist(),
            names[coll["mode"][s]].tolist(),
            ops[coll["op"][s]].tolist(),
            coll["nbytes"][s].tolist(),
            coll["host_ns"][s].tolist(),
            coll["start_ns"][s].tolist(),
            coll["dur_us"][s].tolist(),
            coll["algbw"][s].tolist(),
            coll["busbw"][s].tolist(),
            coll["recv_ns"][s].tolist(),
            classes[ocls[s]].tolist(),
            ofrac[s].tolist(),
        )
        out.write("".join(fmt % row for row in zip(*cols, strict=True)))
    return n


def window_tables(tables: Tables, window: tuple[float, float]) -> Tables:
    """Only what starts ``window`` seconds after the first record (telemetry by its tick time)."""
    starts = [t["start_ns"].min() for t in (tables.coll, tables.copy) if len(t["start_ns"])]
    if not starts:
        return tables
    base = int(min(starts))
    lo = base + window[0] * 1e9
    hi = base + window[1] * 1e9 if math.isfinite(window[1]) else math.inf

    def cut(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keep = (table["start_ns"] >= lo) & (table["start_ns"] <= hi)
        return {name: col[keep] for name, col in table.items()}

    ticks = [(t, tick) for t, tick in tables.ticks if lo <= tick.t_ns <= hi]
    return Tables(cut(tables.coll), cut(tables.copy), tables.hellos, tables.byes, ticks, tables.other)
