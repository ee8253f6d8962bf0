"""The report's rows: per settings epoch, all ranks and then each rank, one row per stream
(process group, op, dtype, size). An epoch of one stream (the synthetic loop) reads its
percentiles out of the epoch's sorted order (:class:`tui.report.kernels._EpochOrder`) and its
sums from the (epoch, rank) sums; an epoch of several streams sorts its records once more by
(stream, duration) (:class:`tui.report.stream_order.StreamOrder`) and sums each slice."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tui.report.kernels import _counts, _EpochOrder, _epochs, _group, _mode_of, _Sums
from tui.report.overlap_report import class_fields
from tui.report.peaks import Peaks, peak_fields
from tui.report.rows import Row, SettingsKey
from tui.report.stream_order import Part, StreamOrder, unsorted_parts
from tui.report.streams import GroupNames, StreamName, stream_name
from tui.report.telemetry import NodeTelemetry, link_means
from workers.wire import protocol as p
from workers.wire.overlap import AFTER, DURING, NO_COPIES
from workers.wire.stats import percentiles_and_max, percentiles_and_max_sorted

_Epoch = tuple[int, int, int, list[tuple[int, int, int]]]  # (epoch, start, end, its (epoch, rank) runs)


@dataclass(frozen=True)
class Records:
    """The collective columns a row slices, sorted by (epoch, rank) (``_Groups.order``):
    durations (float32, for exact percentiles), modes, stream codes (``combos[code]``:
    :func:`tui.report.streams.pack`), and each record's overlap class and overlapped fraction."""

    dur32: np.ndarray
    mode: np.ndarray
    code: np.ndarray
    combos: list[int]
    ocls: np.ndarray
    ofrac: np.ndarray


@dataclass(frozen=True)
class Baselines:
    """The p50 of mode none: per stream code (ascending, = by combo), per (rank, combo), and
    per combo over all ranks."""

    by_code: dict[int, float]
    by_rank: dict[tuple[int, int], float]
    by_combo: dict[int, float]


@dataclass(frozen=True)
class Copies:
    """Copy records sorted by (epoch, rank): where each (epoch, rank) group and each epoch lies
    in them, and the columns the rows read."""

    span: dict[int, tuple[int, int]]  # by epoch << 20 | rank
    epoch: dict[int, tuple[int, int]]
    cols: dict[str, np.ndarray]
    gbps: np.ndarray  # float64

    @classmethod
    def of(cls, copy: dict[str, np.ndarray]) -> Copies:
        by = _group(copy["epoch"], copy["rank"])
        return cls(
            {k: (a, b) for k, a, b in by.runs},
            {e: (a, b) for e, a, b, _ in _epochs(by.runs)},
            {name: copy[name][by.order] for name in ("rank", "step", "nbytes", "direction", "pinned", "dur_us")},
            copy["gbps"][by.order].astype(np.float64),
        )


@dataclass(frozen=True)
class Context:
    """What every row reads besides its own slice of records."""

    recs: Records
    copies: Copies
    sums: _Sums
    t_base: int  # the first start: rows' start_s and end_s count from it
    gid_of: dict[int, int]  # group id by epoch << 20 | rank
    gpu_of: dict[int, tuple[str, str]]  # (host, uuid) by rank
    telemetry: NodeTelemetry
    peaks: Peaks
    base: Baselines
    names: GroupNames
    spans: np.ndarray  # per group id: the rank's time in the epoch (first start to last end), ns

    def stream(self, combo: int) -> StreamName:
        return stream_name(self.names, combo)


class _Sums5(NamedTuple):
    """A row's sums: mean duration, algbw, busbw, time in the stream, its share of the ranks' time."""

    mean_us: float
    algbw_gbps: float
    busbw_gbps: float
    total_ms: float
    step_share: float


#: An epoch's copy settings: (copies per step, copy size, pinned, direction).
_CopySettings = tuple[float | None, int | None, bool | None, str]
#: One row's place: (rank or None for all, records start, end, its group ids, its copies' span).
_Member = tuple[int | None, int, int, list[int], tuple[int, int]]


def _copy_settings(s: dict[str, Any], copies: Copies, ca: int, cb: int, mode: int) -> _CopySettings:
    """What an epoch's copies were: from its settings, else counted from its copy records
    ``ca:cb``; nothing where mode none ran no copies (its settings say nothing)."""
    c = copies.cols
    if "copies" in s:
        count: float | None = int(s["copies"])  # a setting: an integer (CSV "5", not "5.0")
    else:  # count them: copy records per (rank, step)
        steps = len(_counts((c["rank"][ca:cb].astype(np.int64) << 40) | c["step"][ca:cb])[0])
        count = (cb - ca) / steps if steps else 0.0
    # what the copies used (a CPU cannot pin: its records say pageable whatever was asked for)
    pinned = bool(_mode_of(c["pinned"][ca:cb])) if cb > ca else (bool(s["pinned"]) if "pinned" in s else None)
    direction = str(s.get("direction", p.DIRECTIONS[_mode_of(c["direction"][ca:cb])] if cb > ca else ""))
    copy_bytes = _mode_of(c["nbytes"][ca:cb]) if cb > ca else None
    if mode == p.MODES.index("none") and cb == ca:  # no copies ran: their settings say nothing
        return None, None, None, ""
    return count, copy_bytes, pinned, direction


def epoch_rows(
    ctx: Context,
    epochs: list[_Epoch],
    orders: dict[int, _EpochOrder | None],
    settings: dict[int, dict[str, Any]],
) -> tuple[list[Row], dict[SettingsKey, list[tuple[int, int, list[Row]]]], list[StreamOrder | None]]:
    """Per epoch: a row per stream over all ranks, then per rank; the epochs of each settings
    (with their all-ranks rows), in order, for the settings rows; and each epoch's stream order
    (None where it ran one stream or has none)."""
    rows: list[Row] = []
    spans: dict[SettingsKey, list[tuple[int, int, list[Row]]]] = {}
    stream_orders: list[StreamOrder | None] = []
    for e, a_e, b_e, eruns in epochs:
        s = settings.get(e, {})
        ca, cb = ctx.copies.epoch.get(e, (0, 0))
        m = _mode_of(ctx.recs.mode[a_e:b_e])
        copy_settings = _copy_settings(s, ctx.copies, ca, cb, m)
        ids = [ctx.gid_of[key] for key, _, _ in eruns]
        members: list[_Member] = [(None, a_e, b_e, ids, (ca, cb))]
        for key, a, b in eruns:  # key = epoch << 20 | rank
            members.append((key & 0xFFFFF, a, b, [ctx.gid_of[key]], ctx.copies.span.get(key, (0, 0))))
        codes = ctx.recs.code[a_e:b_e]
        if int(codes.min()) == int(codes.max()):  # one stream: the epoch's order serves every row
            combo = ctx.recs.combos[int(codes[0])]
            ordered = orders[a_e]
            new = [
                _row(ctx, e, m, combo, copy_settings, member, None if ordered is None else ordered.group(i - 1))
                for i, member in enumerate(members)
            ]
            stream_orders.append(None)
        else:
            order = StreamOrder.of(ctx.recs.dur32[a_e:b_e], codes, ctx.recs.ocls[a_e:b_e], [b - a for _, a, b in eruns])
            new = _stream_rows(ctx, e, m, copy_settings, members, order)
            stream_orders.append(order)
        rows += new
        every = [r for r in new if r.rank is None]
        knobs = " ".join(f"{k}={v}" for k, v in sorted(dict(s.get("knobs") or {}).items()))
        settings_key = SettingsKey(every[0].mode, *copy_settings, knobs)
        spans.setdefault(settings_key, []).append((a_e, b_e, every))
    return rows, spans, stream_orders


def _row(
    ctx: Context,
    e: int,
    m: int,
    combo: int,
    copy_settings: _CopySettings,
    member: _Member,
    ordered: tuple[np.ndarray, dict[int, np.ndarray]] | None,
) -> Row:
    """The row of an epoch of one stream for one rank (None: all ranks): its records in the
    sorted columns, its groups, its copies, and (``ordered``) its durations already sorted,
    overall and per class, where the epoch has an order."""
    recs, sums = ctx.recs, ctx.sums
    rank, a, b, gids, copy_span = member
    if ordered is None:
        (p50, p90, p99), top = percentiles_and_max(recs.dur32[a:b], [50, 90, 99])
        by_class = None
    else:
        (p50, p90, p99), top = percentiles_and_max_sorted(ordered[0], [50, 90, 99])
        by_class = ordered[1]
    n = b - a
    total_us = float(sums.dur[gids].sum())
    sums_of = _Sums5(
        total_us / n,
        float(sums.alg[gids].sum()) / n,
        float(sums.bus[gids].sum()) / n,
        total_us / 1e3,
        _share(total_us, ctx.spans[gids]),
    )
    classes = class_fields(recs.dur32[a:b], recs.ocls[a:b], recs.ofrac[a:b], by_class)
    return _make_row(ctx, e, m, combo, copy_settings, member, n, (p50, p90, p99, top), sums_of, classes)


def _share(total_us: float, spans_ns: np.ndarray) -> float:
    time_ns = float(spans_ns.sum())
    return total_us * 1e3 / time_ns if time_ns > 0 else math.nan


def _make_row(
    ctx: Context,
    e: int,
    m: int,
    combo: int,
    copy_settings: _CopySettings,
    member: _Member,
    n: int,
    quantiles: tuple[float, float, float, float],
    sums_of: _Sums5,
    classes: dict[str, Any],
) -> Row:
    rank, _, _, _, copy_span = member
    stream = ctx.stream(combo)
    p50 = quantiles[0]
    base = ctx.base.by_combo.get(combo) if rank is None else ctx.base.by_rank.get((rank, combo))
    gpu = None if rank is None else ctx.gpu_of.get(rank, ("", ""))
    t0, t1 = ctx.sums.windows[e]
    ga, gb = copy_span
    copies, copy_bytes, pinned, direction = copy_settings
    copy_gbps = float(ctx.copies.gbps[ga:gb].mean()) if gb > ga else math.nan
    return Row(
        epoch=e,
        rank=rank,
        group=stream.group,
        group_desc=stream.group_desc,
        group_size=stream.group_size,
        op=stream.op,
        dtype=stream.dtype,
        nbytes=stream.nbytes,
        count=n,
        p50_us=p50,
        p90_us=quantiles[1],
        p99_us=quantiles[2],
        max_us=quantiles[3],
        start_s=(t0 - ctx.t_base) / 1e9,
        end_s=(t1 - ctx.t_base) / 1e9,
        mode=p.MODES[m] if m < len(p.MODES) else f"mode{m}",
        copies=copies,
        copy_bytes=copy_bytes,
        pinned=pinned,
        direction=direction,
        copy_count=gb - ga,
        copy_gbps=copy_gbps,
        slowdown=p50 / base if base else math.nan,
        mean_us=sums_of.mean_us,
        algbw_gbps=sums_of.algbw_gbps,
        busbw_gbps=sums_of.busbw_gbps,
        total_ms=sums_of.total_ms,
        step_share=sums_of.step_share,
        **link_means(ctx.telemetry, t0, t1, gpu),
        **classes,
        **peak_fields(copy_gbps, sums_of.busbw_gbps, ctx.peaks, stream.op, stream.nbytes),
    )


def _stream_rows(
    ctx: Context,
    e: int,
    m: int,
    copy_settings: _CopySettings,
    members: list[_Member],
    order: StreamOrder | None,
) -> list[Row]:
    """The rows of an epoch of several streams: per member (all ranks, then each rank) one row
    per stream it ran, from the epoch's records sorted by (stream, duration) (``order``; None:
    sorted per subset)."""
    recs = ctx.recs
    rows = []
    for index, member in enumerate(members):
        _, a, b, gids, _ = member
        if order is not None:
            parts, is_sorted = order.parts(index - 1), True
        else:
            parts, is_sorted = unsorted_parts(recs.dur32[a:b], recs.code[a:b], recs.ocls[a:b]), False
        overlap = _overlap_means(recs.code[a:b], recs.ocls[a:b], recs.ofrac[a:b])
        time_ns = float(ctx.spans[gids].sum())
        for code in sorted(parts):
            combo = recs.combos[code]
            rows.append(
                _part_row(ctx, e, m, combo, copy_settings, member, parts[code], is_sorted, overlap.get(code), time_ns)
            )
    return rows


def _overlap_means(code: np.ndarray, ocls: np.ndarray, ofrac: np.ndarray) -> dict[int, float]:
    """Per stream code: the mean overlapped fraction of its collectives during copies."""
    during = ocls == DURING
    if not during.any():
        return {}
    c = code[during].astype(np.intp)
    count = np.bincount(c)
    total = np.bincount(c, weights=ofrac[during].astype(np.float64))
    return {int(k): float(total[k] / count[k]) for k in np.flatnonzero(count).tolist()}


def _part_row(
    ctx: Context,
    e: int,
    m: int,
    combo: int,
    copy_settings: _CopySettings,
    member: _Member,
    part: Part,
    is_sorted: bool,
    overlapped: float | None,
    time_ns: float,
) -> Row:
    values, cls = part
    n = len(values)
    stream = ctx.stream(combo)
    if is_sorted:
        (p50, p90, p99), top = percentiles_and_max_sorted(values, [50, 90, 99])
        by_class: dict[int, np.ndarray] | None = {c: values[cls == c] for c in (NO_COPIES, DURING, AFTER)}
    else:
        (p50, p90, p99), top = percentiles_and_max(values, [50, 90, 99])
        by_class = None
    d = values.astype(np.float64)
    total_us = float(d.sum())
    # at the average duration, as nccl-tests and the live view (tui.model.stats.RunStats) give it:
    # algbw = S / mean t, busbw = algbw x factor (the mean of the records' own rates came out
    # higher than the live view's for the same stream: a few fast records weigh most)
    algbw = stream.nbytes / max(total_us / n, 1e-3) / 1e3 if n else math.nan
    sums_of = _Sums5(
        total_us / n,
        algbw,
        algbw * stream.bus_factor,
        total_us / 1e3,
        total_us * 1e3 / time_ns if time_ns > 0 else math.nan,
    )
    classes = class_fields(values, cls, np.zeros(n, dtype=np.float32), by_class)
    classes["during_overlap"] = overlapped if overlapped is not None else math.nan
    return _make_row(ctx, e, m, combo, copy_settings, member, n, (p50, p90, p99, top), sums_of, classes)
