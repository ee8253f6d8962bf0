"""`commtop report FILE`: every number of a recording's report, per stream, settings epoch and rank.

For every epoch (mode, copies, copy size, pinned, direction), rank and stream (process group,
op, dtype, size): collective latency p50/p90/p99/max, algbw/busbw, time in the stream and its
share of the ranks' time, copy GB/s, PCIe/NVLink and clocks from the node telemetry in the
epoch's time window, and the slowdown against mode ``none`` (same rank and stream) in the same
recording; per epoch and rank the step view; per group its straggler; per rank what is missing.
Everything is columnar numpy over the whole file (:mod:`tui.report.kernels`), so ten million
records take seconds.

:func:`build_report` runs a few named steps: group the records by (epoch, rank) and sum them,
name their streams, sort the columns a row slices, re-analyse the A/B experiments, sort each
epoch once, take the baselines of mode none, then the rows per epoch, rank and stream, per
settings and per mode, the steps, groups, ranks and whole-recording streams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from tui.model.job import JobInfo
from tui.recordings.bulk import usable_cpus, worker_threads
from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.recordings.writer import run_metadata
from tui.report.endings import job_ending
from tui.report.epoch_rows import Baselines, Context, Copies, Records, epoch_rows
from tui.report.groups_report import group_rows, rank_rows
from tui.report.kernels import (
    _baselines,
    _baselines_of_pure_epochs,
    _counts,
    _EpochOrder,
    _epochs,
    _group,
    _Groups,
    _median,
    _median_sorted,
    _Sums,
    _sums_of_columns,
    _sums_of_summary,
    _weighted_mean,
)
from tui.report.nccl_tests import MeasuredPeaks
from tui.report.overlap_report import ab_sections, class_p50s
from tui.report.peaks import link_peaks
from tui.report.reading import report_columns, report_tables
from tui.report.rows import ModeRow, Report, Row, SettingsKey, SettingsRow, StreamRow
from tui.report.steps_report import RunWalk, step_rows
from tui.report.stream_order import StreamOrder
from tui.report.streams import GroupNames, group_names, stream_codes, stream_name
from tui.report.telemetry import HBM_UTIL, NodeTelemetry, link_tx
from workers.wire import protocol as p
from workers.wire.overlap import AFTER, DURING, NO_COPIES, classify_columns
from workers.wire.stats import percentiles, percentiles_and_max_sorted

#: Threads at most for the epochs' sorts (numpy sorts, without the GIL).
MAX_SORT_THREADS = 4
#: Side threads at most for the steps' pass over the (epoch, rank) runs, where more than two CPUs
#: are usable (on two: one, beside the epochs' sorts); the main thread joins them after its sorts.
MAX_STEP_THREADS = 4

_Run = tuple[int, int, int]  # (key = epoch << 20 | rank, start, end) of one (epoch, rank) group
_Epoch = tuple[int, int, int, list[_Run]]  # (epoch, start, end, its (epoch, rank) runs)


def build_report(rec: Recording, tables: Tables | None = None, measured: Sequence[MeasuredPeaks] = ()) -> Report:
    """Every number of the report, from a recording (``tables`` when already loaded: with the
    columns of :func:`~tui.report.reading.report_columns`, or of
    :func:`~tui.report.reading.summary_columns` and the summaries)."""
    tables, g, sums = _grouped(rec, tables or report_tables(rec))
    meta = _meta_with_hellos(rec.meta, tables.hellos)
    coll = tables.coll
    telemetry = NodeTelemetry(tables.ticks)
    peaks = link_peaks(tables.ticks, [msg for _, msg in tables.other], measured)
    world = int(meta.get("world_size") or len(meta.get("ranks") or []) or 0)
    names = group_names(coll["rank"], coll["group"], tables.hellos, world, sorted({k & 0xFFFFF for k, _, _ in g.runs}))
    recs, sums = _sorted_records(tables, g, sums, names)
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
    # the steps' pass (gathers and sorts per (epoch, rank): numpy, mostly without the GIL) on
    # side threads beside the epochs' sorts; this thread joins it once the sorts are done
    taken = {h.rank: h.steps for _, h in tables.hellos}  # the last Hello of each rank says last (-1: not counted)
    walk = RunWalk(g, coll, recs.dur32, names.index, names.single, taken)
    side_threads = worker_threads(MAX_STEP_THREADS) if usable_cpus() > 2 else 1
    with ThreadPoolExecutor(max_workers=side_threads, thread_name_prefix="commtop-step-runs") as side:
        walking = [side.submit(walk.work) for _ in range(side_threads)]
        orders, pure_epochs = _sort_epochs(epochs, recs)
        epoch_orders = {a: o for a, o in orders.items() if o is not None}
        base = _none_baselines(g.runs, epochs, epoch_orders, pure_epochs, recs)
        walk.work()
        for done in walking:
            done.result()
    found = walk.result()
    gid_of = dict(zip((key for key, _, _ in g.runs), g.ids, strict=True))
    copies = Copies.of(tables.copy)
    ctx = Context(
        recs=recs,
        copies=copies,
        sums=sums,
        t_base=sums.t_base if sums.t_base is not None else rec.first_ns,
        gid_of=gid_of,
        gpu_of={h.rank: (h.host, h.gpu_uuid) for _, h in tables.hellos},
        telemetry=telemetry,
        peaks=peaks,
        base=base,
        names=names,
        spans=found.span_ns,
    )
    rows, spans, stream_orders = epoch_rows(ctx, epochs, orders, _settings_by_epoch(tables.hellos))
    job = JobInfo.of(meta.get("config"))
    return Report(
        path=rec.path,
        complete=rec.complete,
        problems=rec.summary(),
        meta=meta,
        duration_s=(rec.last_ns - rec.first_ns) / 1e9,
        records=len(recs.dur32),
        rows=tuple(rows),
        modes=tuple(_mode_rows(recs, pure_epochs, epoch_orders, base.by_code)),
        ab=ab,
        peaks=peaks,
        settings=tuple(_settings_rows(spans, recs, epoch_orders)),
        job=job,
        steps=tuple(step_rows(epochs, gid_of, found, recs.ocls, (copies.span, copies.cols))),
        groups=tuple(group_rows(names, recs.combos, found.groups)),
        ranks=tuple(_rank_rows(g, tables)),
        streams=tuple(
            _stream_rows(recs, names, ctx.spans, stream_orders) if job.is_job or len(recs.combos) > 1 else ()
        ),
        ending=job_ending(tables.byes, rec.first_ns, tables.hellos),
    )


def _rank_rows(g: _Groups, tables: Tables) -> list:
    """Per rank: records, the gaps in its iterations (first and last record of each (epoch, rank)
    run: a rank's records come in issue order), and what it lost."""
    records: dict[int, int] = {}
    its: dict[int, tuple[int, int]] = {}
    ends = np.array([i for _, a, b in g.runs for i in (a, b - 1)], dtype=np.intp)
    edges = tables.coll_values("iteration", g.order[ends]).tolist() if len(ends) else []
    for (key, a, b), lo, hi in zip(g.runs, edges[::2], edges[1::2], strict=True):
        r = key & 0xFFFFF
        records[r] = records.get(r, 0) + b - a
        old = its.get(r)
        its[r] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    ranks = sorted(set(records) | {h.rank for _, h in tables.hellos})
    return rank_rows(ranks, records, its, tables.hellos)


def _stream_rows(
    recs: Records, names: GroupNames, spans: np.ndarray, epoch_orders: list[StreamOrder | None]
) -> list[StreamRow]:
    """Each stream over the whole recording, all ranks and epochs: the epochs' stream orders
    merged, else one sort by stream and duration."""
    order = StreamOrder.union(epoch_orders) or StreamOrder.of(recs.dur32, recs.code, recs.ocls, [len(recs.dur32)])
    parts = order.parts(-1) if order is not None else {}
    time_ns = float(spans.sum())
    out = []
    for code, (values, _) in sorted(parts.items()):
        stream = stream_name(names, recs.combos[code])
        (p50, p99), top = percentiles_and_max_sorted(values, [50, 99])
        d = values.astype(np.float64)
        total_us = float(d.sum())
        algbw = stream.nbytes / max(total_us / len(values), 1e-3) / 1e3  # at the mean duration (nccl-tests)
        out.append(
            StreamRow(
                group=stream.group,
                group_desc=stream.group_desc,
                group_size=stream.group_size,
                op=stream.op,
                dtype=stream.dtype,
                nbytes=stream.nbytes,
                count=len(values),
                p50_us=p50,
                p99_us=p99,
                max_us=top,
                busbw_gbps=algbw * stream.bus_factor,
                total_ms=total_us / 1e3,
                step_share=total_us * 1e3 / time_ns if time_ns > 0 else math.nan,
            )
        )
    return out


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
    g = _groups_of(tables)
    lean = "busbw" not in tables.coll  # read with summary_columns: the sums must come from the summaries
    sums = _sums_of_summary(tables.coll_summary, g) if lean else None
    if lean and sums is None:  # summaries missing or not adding up: read the columns
        tables = rec.tables(coll_columns=report_columns(rec), group_by=_group)
        g = _groups_of(tables)  # (the chunks it takes are checked anew)
    return tables, g, sums


def _groups_of(tables: Tables) -> _Groups:
    """The records grouped by (epoch, rank): as the reader grouped them while it decoded the
    other columns (:func:`~tui.report.reading.report_tables`), else now."""
    if isinstance(tables.coll_grouped, _Groups):
        return tables.coll_grouped
    return _group(tables.coll["epoch"], tables.coll["rank"])


def _sorted_records(tables: Tables, g: _Groups, sums: _Sums | None, names: GroupNames) -> tuple[Records, _Sums]:
    """The columns that need a slice per row, sorted once by (epoch, rank); the overlap classes
    still in file order (build_report sorts them once the A/B sections have read them).

    Sums per row come from the chunks' summaries, or per-group sums over the columns in file
    order, time windows from a blocked pass: no full-size temporaries. Those (numpy, without
    the GIL) run on a second thread meanwhile."""
    coll, copy = tables.coll, tables.copy
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commtop-report") as side:
        summed = side.submit(_sums_of_columns, coll, g) if sums is None else None
        order = g.order
        gathered = side.submit(np.take, coll["dur_us"], order)  # percentiles sort these (workers.wire.stats)
        if len(copy["rank"]):
            ocls, ofrac = classify_columns(coll, copy)
        else:  # what classify_columns says of collectives without copies, without reading their steps
            ocls, ofrac = np.zeros(len(order), dtype=np.uint8), np.zeros(len(order), dtype=np.float32)
        mode = coll["mode"][order]
        codes, combos = stream_codes(names.index, coll["op"], coll["dtype"], coll["nbytes"])
        code = codes[order]
        dur32 = gathered.result()
        if summed is not None:
            sums = summed.result()
    assert sums is not None
    return Records(dur32, mode, code, combos, ocls, ofrac), sums


def _sort_epochs(
    epochs: list[_Epoch], recs: Records
) -> tuple[dict[int, _EpochOrder | None], dict[int, list[tuple[int, int, int]]]]:
    """Each epoch's durations sorted once (:class:`_EpochOrder`, by the epoch's first record),
    and per mode its epochs of that one mode and one (op, size) code, as (start, end, code):
    their orders also give the baselines and the per-mode rows."""
    orders: dict[int, _EpochOrder | None] = {}
    pure_epochs: dict[int, list[tuple[int, int, int]]] = {}
    dur32, ocls = recs.dur32, recs.ocls
    threads = worker_threads(MAX_SORT_THREADS)  # numpy sorts, without the GIL
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="commtop-sort") as pool:
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


def _none_baselines(
    runs: list[_Run],
    epochs: list[_Epoch],
    epoch_orders: dict[int, _EpochOrder],
    pure_epochs: dict[int, list[tuple[int, int, int]]],
    recs: Records,
) -> Baselines:
    """The slowdown's baselines: read out of the sorted epochs where they can be, else from the records."""
    none_mode = p.MODES.index("none")
    baselines = _baselines_of_pure_epochs(epochs, epoch_orders, pure_epochs.get(none_mode, []), recs.mode, none_mode)
    if baselines is None:
        baselines = _baselines(runs, recs.mode, recs.code, recs.dur32, none_mode)
    by_code = baselines[0]
    return Baselines(
        by_code,
        {(r, recs.combos[k]): v for (r, k), v in baselines[1].items()},
        {recs.combos[k]: v for k, v in by_code.items()},
    )


def _settings_rows(
    spans: dict[SettingsKey, list[tuple[int, int, list[Row]]]], recs: Records, epoch_orders: dict[int, _EpochOrder]
) -> list[SettingsRow]:
    """A row per distinct settings: every epoch that ran with them, all ranks together (busbw:
    over the epochs' streams, weighted by records; copies: once per epoch)."""
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
        firsts = [rows[0] for _, _, rows in parts_of]  # the epoch's facts: on each of its stream rows
        by_settings.append(
            SettingsRow(
                key=settings_key,
                epochs=tuple(r.epoch for r in firsts),
                count=len(durations),
                p50_us=p50,
                p99_us=p99,
                busbw_gbps=_weighted_mean([(r.busbw_gbps, r.count) for _, _, rows in parts_of for r in rows]),
                copy_gbps=_weighted_mean([(r.copy_gbps, r.copy_count) for r in firsts]),
                **dict(zip(("during_p50_us", "after_p50_us", "none_p50_us"), class_p50, strict=True)),
            )
        )
    return by_settings


def _mode_rows(
    recs: Records,
    pure_epochs: dict[int, list[tuple[int, int, int]]],
    epoch_orders: dict[int, _EpochOrder],
    base_code: dict[int, float],
) -> list[ModeRow]:
    """A row per offload mode, all ranks and epochs together, with its slowdown against none."""
    dur32, mode, code, ocls = recs.dur32, recs.mode, recs.code, recs.ocls
    modes = []
    present, mcounts = _counts(mode)  # a few modes: no full-size widening as np.bincount's
    for m, count in zip(present.tolist(), mcounts.tolist(), strict=True):
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
