"""`commtop report FILE`: every number of a recording's report, per settings epoch and per rank.

For every epoch (mode, copies, copy size, pinned, direction) and rank: collective latency
p50/p90/p99/max, algbw/busbw, copy GB/s, PCIe/NVLink and clocks from the node telemetry in
the epoch's time window, and the slowdown against mode ``none`` (same rank, same collective
and size) in the same recording. Everything is columnar numpy over the whole file
(:mod:`tui.report.kernels`), so ten million records take seconds.

:func:`build_report` runs a few named steps: group the records by (epoch, rank) and sum them,
sort the columns a row slices, re-analyse the A/B experiments, sort each epoch once, take the
baselines of mode none, then the rows per epoch and rank, per settings and per mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.recordings.writer import run_metadata
from tui.report.kernels import (
    _baselines,
    _baselines_of_pure_epochs,
    _combo_codes,
    _counts,
    _EpochOrder,
    _epochs,
    _group,
    _Groups,
    _median,
    _median_sorted,
    _mode_of,
    _Sums,
    _sums_of_columns,
    _sums_of_summary,
    _weighted_mean,
)
from tui.report.nccl_tests import MeasuredPeaks
from tui.report.overlap_report import ab_sections, class_fields, class_p50s
from tui.report.peaks import Peaks, link_peaks, peak_fields
from tui.report.reading import report_columns, report_tables
from tui.report.rows import ModeRow, Report, Row, SettingsKey, SettingsRow
from tui.report.telemetry import HBM_UTIL, NodeTelemetry, link_means, link_tx
from workers.wire import protocol as p
from workers.wire.overlap import AFTER, DURING, NO_COPIES, classify_columns
from workers.wire.stats import percentiles, percentiles_and_max, percentiles_and_max_sorted

_Run = tuple[int, int, int]  # (key = epoch << 20 | rank, start, end) of one (epoch, rank) group
_Epoch = tuple[int, int, int, list[_Run]]  # (epoch, start, end, its (epoch, rank) runs)


def build_report(rec: Recording, tables: Tables | None = None, measured: Sequence[MeasuredPeaks] = ()) -> Report:
    """Every number of the report, from a recording (``tables`` when already loaded: with the
    columns of :func:`~tui.report.reading.report_columns`, or of
    :func:`~tui.report.reading.summary_columns` and the summaries)."""
    tables, g, sums = _grouped(rec, tables or report_tables(rec))
    telemetry = NodeTelemetry(tables.ticks)
    peaks = link_peaks(tables.ticks, [msg for _, msg in tables.other], measured)
    recs, sums = _sorted_records(tables, g, sums)
    ab = tuple(
        ab_sections(
            tables,
            recs.ocls,
            recs.ofrac,
            lambda t0, t1: link_tx(telemetry, t0, t1),
            lambda t0, t1: telemetry.mean(HBM_UTIL, t0, t1, None),
            sums.starts,
        )
    )
    if len(tables.copy["rank"]):  # the A/B sections read the classes in file order, the rows by group
        recs = replace(recs, ocls=recs.ocls[g.order], ofrac=recs.ofrac[g.order])
    epochs = _epochs(g.runs)
    orders, pure_epochs = _sort_epochs(epochs, recs)
    epoch_orders = {a: o for a, o in orders.items() if o is not None}
    base = _none_baselines(g.runs, epochs, epoch_orders, pure_epochs, recs)
    ctx = _Context(
        recs=recs,
        copies=_Copies.of(tables.copy),
        sums=sums,
        t_base=sums.t_base if sums.t_base is not None else rec.first_ns,
        gid_of=dict(zip((key for key, _, _ in g.runs), g.ids, strict=True)),
        gpu_of={h.rank: (h.host, h.gpu_uuid) for _, h in tables.hellos},
        telemetry=telemetry,
        peaks=peaks,
        base=base,
    )
    rows, spans = _epoch_rows(ctx, epochs, orders, _settings_by_epoch(tables.hellos))
    return Report(
        path=rec.path,
        complete=rec.complete,
        problems=rec.summary(),
        meta=_meta_with_hellos(rec.meta, tables.hellos),
        duration_s=(rec.last_ns - rec.first_ns) / 1e9,
        records=len(recs.dur32),
        rows=tuple(rows),
        modes=tuple(_mode_rows(recs, pure_epochs, epoch_orders, base.by_code)),
        ab=ab,
        peaks=peaks,
        settings=tuple(_settings_rows(spans, recs, epoch_orders)),
    )


# --------------------------------------------------------------------------- the run's facts


#: Settings only commtop's own loop acts on: a user's job (monitor API, capture) reports their
#: defaults, so its copies are counted from its copy records instead.
_LOOP_COPY_SETTINGS = ("copies", "copy_scale", "pinned", "direction")


def _settings_by_epoch(hellos: Sequence[tuple[int, p.Hello]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for _, h in hellos:
        settings = dict(h.settings)
        if h.config.get("source") == "monitor":
            for name in _LOOP_COPY_SETTINGS:
                settings.pop(name, None)
        out.setdefault(h.epoch, settings)
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


# --------------------------------------------------------------------------- the steps


def _grouped(rec: Recording, tables: Tables) -> tuple[Tables, _Groups, _Sums | None]:
    """The records grouped by (epoch, rank), and their sums where the chunks' summaries give
    them. Tables read with ``summary_columns`` whose summaries are missing or do not add
    up are read again with the report's columns (the sums then come from those)."""
    g = _group(tables.coll["epoch"], tables.coll["rank"])
    lean = "busbw" not in tables.coll  # read with summary_columns: the sums must come from the summaries
    sums = _sums_of_summary(tables.coll_summary, g) if lean else None
    if lean and sums is None:  # summaries missing or not adding up: read the columns
        tables = rec.tables(coll_columns=report_columns(rec))
        g = _group(tables.coll["epoch"], tables.coll["rank"])  # (the chunks it takes are checked anew)
    return tables, g, sums


@dataclass(frozen=True)
class _Records:
    """The collective columns a row slices, sorted by (epoch, rank) (``_Groups.order``):
    durations (float32, for exact percentiles), modes, (op, size) codes (``combos[code]`` is
    ``op << 48 | size``), and each record's overlap class and overlapped fraction."""

    dur32: np.ndarray
    mode: np.ndarray
    code: np.ndarray
    combos: list[int]
    ocls: np.ndarray
    ofrac: np.ndarray


def _sorted_records(tables: Tables, g: _Groups, sums: _Sums | None) -> tuple[_Records, _Sums]:
    """The columns that need a slice per row, sorted once by (epoch, rank); the overlap classes
    still in file order (build_report sorts them once the A/B sections have read them).

    Sums per row come from the chunks' summaries, or per-group sums over the columns in file
    order, time windows from a blocked pass: no full-size temporaries. Those (numpy, without
    the GIL) run on a second thread meanwhile."""
    coll, copy = tables.coll, tables.copy
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
    return _Records(dur32, mode, code, combos, ocls, ofrac), sums


def _sort_epochs(
    epochs: list[_Epoch], recs: _Records
) -> tuple[dict[int, _EpochOrder | None], dict[int, list[tuple[int, int, int]]]]:
    """Each epoch's durations sorted once (:class:`_EpochOrder`, by the epoch's first record),
    and per mode its epochs of that one mode and one (op, size) code, as (start, end, code):
    their orders also give the baselines and the per-mode rows."""
    orders: dict[int, _EpochOrder | None] = {}
    pure_epochs: dict[int, list[tuple[int, int, int]]] = {}
    dur32, ocls = recs.dur32, recs.ocls
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
            e_modes, e_codes = recs.mode[a_e:b_e], recs.code[a_e:b_e]
            if e_modes.min() == e_modes.max() and e_codes.min() == e_codes.max():  # one mode, one (op, size)
                pure_epochs.setdefault(int(e_modes[0]), []).append((a_e, b_e, int(e_codes[0])))
    return orders, pure_epochs


@dataclass(frozen=True)
class _Baselines:
    """The p50 of mode none: per (op, size) code (ascending, = by combo), per (rank, combo),
    and per combo over all ranks."""

    by_code: dict[int, float]
    by_rank: dict[tuple[int, int], float]
    by_combo: dict[int, float]


def _none_baselines(
    runs: list[_Run],
    epochs: list[_Epoch],
    epoch_orders: dict[int, _EpochOrder],
    pure_epochs: dict[int, list[tuple[int, int, int]]],
    recs: _Records,
) -> _Baselines:
    """The slowdown's baselines: read out of the sorted epochs where they can be, else from the records."""
    none_mode = p.MODES.index("none")
    baselines = _baselines_of_pure_epochs(epochs, epoch_orders, pure_epochs.get(none_mode, []), recs.mode, none_mode)
    if baselines is None:
        baselines = _baselines(runs, recs.mode, recs.code, recs.dur32, none_mode)
    by_code = baselines[0]
    return _Baselines(
        by_code,
        {(r, recs.combos[k]): v for (r, k), v in baselines[1].items()},
        {recs.combos[k]: v for k, v in by_code.items()},
    )


@dataclass(frozen=True)
class _Copies:
    """Copy records sorted by (epoch, rank): where each (epoch, rank) group and each epoch lies
    in them, and the columns the rows read."""

    span: dict[int, tuple[int, int]]  # by epoch << 20 | rank
    epoch: dict[int, tuple[int, int]]
    cols: dict[str, np.ndarray]
    gbps: np.ndarray  # float64

    @classmethod
    def of(cls, copy: dict[str, np.ndarray]) -> _Copies:
        by = _group(copy["epoch"], copy["rank"])
        return cls(
            {k: (a, b) for k, a, b in by.runs},
            {e: (a, b) for e, a, b, _ in _epochs(by.runs)},
            {name: copy[name][by.order] for name in ("rank", "step", "nbytes", "direction", "pinned")},
            copy["gbps"][by.order].astype(np.float64),
        )


@dataclass(frozen=True)
class _Context:
    """What every row reads besides its own slice of records."""

    recs: _Records
    copies: _Copies
    sums: _Sums
    t_base: int  # the first start: rows' start_s and end_s count from it
    gid_of: dict[int, int]  # group id by epoch << 20 | rank
    gpu_of: dict[int, tuple[str, str]]  # (host, uuid) by rank
    telemetry: NodeTelemetry
    peaks: Peaks
    base: _Baselines


#: An epoch's copy settings: (copies per step, copy size, pinned, direction).
_CopySettings = tuple[float | None, int | None, bool | None, str]


def _copy_settings(s: dict[str, Any], copies: _Copies, ca: int, cb: int, mode: int) -> _CopySettings:
    """What an epoch's copies were: from its settings, else counted from its copy records
    ``ca:cb`` (host memory from the records when there are any); nothing where mode none ran no
    copies (its settings say nothing)."""
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


def _epoch_rows(
    ctx: _Context,
    epochs: list[_Epoch],
    orders: dict[int, _EpochOrder | None],
    settings: dict[int, dict[str, Any]],
) -> tuple[list[Row], dict[SettingsKey, list[tuple[int, int, Row]]]]:
    """A row per epoch over all ranks, then one per rank; and the epochs of each settings (all
    ranks), in order, for the settings rows."""
    rows: list[Row] = []
    spans: dict[SettingsKey, list[tuple[int, int, Row]]] = {}
    for e, a_e, b_e, eruns in epochs:
        s = settings.get(e, {})
        ca, cb = ctx.copies.epoch.get(e, (0, 0))
        m = _mode_of(ctx.recs.mode[a_e:b_e])
        copy_settings = _copy_settings(s, ctx.copies, ca, cb, m)
        combo = ctx.recs.combos[_mode_of(ctx.recs.code[a_e:b_e])]
        ids = [ctx.gid_of[key] for key, _, _ in eruns]
        groups: list[tuple[int | None, int, int, list[int], tuple[int, int]]] = [(None, a_e, b_e, ids, (ca, cb))]
        for key, a, b in eruns:  # key = epoch << 20 | rank
            groups.append((key & 0xFFFFF, a, b, [ctx.gid_of[key]], ctx.copies.span.get(key, (0, 0))))
        ordered = orders[a_e]
        for index, (rank, a, b, gids, copy_span) in enumerate(groups):
            member = None if ordered is None else ordered.group(index - 1)
            rows.append(_row(ctx, e, m, combo, copy_settings, rank, (a, b), gids, copy_span, member))
            if rank is None:
                knobs = " ".join(f"{k}={v}" for k, v in sorted(dict(s.get("knobs") or {}).items()))
                settings_key = SettingsKey(rows[-1].mode, *copy_settings, knobs)
                spans.setdefault(settings_key, []).append((a_e, b_e, rows[-1]))
    return rows, spans


def _row(
    ctx: _Context,
    e: int,
    m: int,
    combo: int,
    copy_settings: _CopySettings,
    rank: int | None,
    span: tuple[int, int],
    gids: list[int],
    copy_span: tuple[int, int],
    member: tuple[np.ndarray, dict[int, np.ndarray]] | None,
) -> Row:
    """One epoch's row for one rank (``rank`` None: all ranks): its records ``span`` in the
    sorted columns, its groups ``gids``, its copies ``copy_span``, and (``member``) its
    durations already sorted, overall and per class, where the epoch has an order."""
    recs, sums = ctx.recs, ctx.sums
    a, b = span
    if member is None:
        (p50, p90, p99), top = percentiles_and_max(recs.dur32[a:b], [50, 90, 99])
        by_class = None
    else:
        (p50, p90, p99), top = percentiles_and_max_sorted(member[0], [50, 90, 99])
        by_class = member[1]
    n = b - a
    op, nbytes = combo >> 48, combo & ((1 << 48) - 1)
    base = ctx.base.by_combo.get(combo) if rank is None else ctx.base.by_rank.get((rank, combo))
    gpu = None if rank is None else ctx.gpu_of.get(rank, ("", ""))
    t0, t1 = sums.windows[e]
    ga, gb = copy_span
    copies, copy_bytes, pinned, direction = copy_settings
    copy_gbps = float(ctx.copies.gbps[ga:gb].mean()) if gb > ga else math.nan
    busbw = float(sums.bus[gids].sum()) / n
    return Row(
        epoch=e,
        rank=rank,
        mode=p.MODES[m] if m < len(p.MODES) else f"mode{m}",
        copies=copies,
        copy_bytes=copy_bytes,
        pinned=pinned,
        direction=direction,
        op=p.OP_NAMES[op] if op < len(p.OP_NAMES) else f"op{op}",
        nbytes=nbytes,
        start_s=(t0 - ctx.t_base) / 1e9,
        end_s=(t1 - ctx.t_base) / 1e9,
        count=n,
        p50_us=p50,
        p90_us=p90,
        p99_us=p99,
        max_us=top,
        mean_us=float(sums.dur[gids].sum()) / n,
        algbw_gbps=float(sums.alg[gids].sum()) / n,
        busbw_gbps=busbw,
        copy_count=gb - ga,
        copy_gbps=copy_gbps,
        slowdown=p50 / base if base else math.nan,
        **link_means(ctx.telemetry, t0, t1, gpu),
        **class_fields(recs.dur32[a:b], recs.ocls[a:b], recs.ofrac[a:b], by_class),
        **peak_fields(copy_gbps, busbw, ctx.peaks, p.OP_NAMES[op] if op < len(p.OP_NAMES) else "", nbytes),
    )


def _settings_rows(
    spans: dict[SettingsKey, list[tuple[int, int, Row]]], recs: _Records, epoch_orders: dict[int, _EpochOrder]
) -> list[SettingsRow]:
    """A row per distinct settings: every epoch that ran with them, all ranks together."""
    by_settings = []
    for settings_key, parts_of in spans.items():
        durations = np.concatenate([recs.dur32[a:b] for a, b, _ in parts_of])
        merged = _EpochOrder.union([epoch_orders.get(a) for a, _, _ in parts_of])
        if merged is None:
            p50, p99 = percentiles(durations, [50, 99])
            class_p50 = class_p50s(durations, np.concatenate([recs.ocls[a:b] for a, b, _ in parts_of]))
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
    return by_settings


def _mode_rows(
    recs: _Records,
    pure_epochs: dict[int, list[tuple[int, int, int]]],
    epoch_orders: dict[int, _EpochOrder],
    base_code: dict[int, float],
) -> list[ModeRow]:
    """A row per offload mode, all ranks and epochs together, with its slowdown against none."""
    dur32, mode, code, ocls = recs.dur32, recs.mode, recs.code, recs.ocls
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
    return modes
