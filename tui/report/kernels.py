"""The report's numpy passes over millions of records: grouping by (epoch, rank), sums per
group (from the columns or from the chunks' summaries), each epoch's window, small codes for
(op, size), one sort per epoch (:class:`_EpochOrder`) that every rank's and class's percentiles
are read from, and the baselines of mode none. No recording, no rows, no text: arrays in,
arrays and numbers out (:mod:`tui.report.build` puts them together)."""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tui.recordings import summary as chunk_summary
from tui.recordings.summary import window_end_ns
from tui.report.placed import placed
from workers.wire.overlap import AFTER, DURING, NO_COPIES

#: The percentiles the report reads (the maximum and the median are read too): an epoch's
#: values need to be in order only where these are read (:func:`_in_order`).
REPORT_QS = (50, 90, 99)
#: Values at least this many: worth asking whether a sort or placing them is faster here.
_CHOOSE_AT = 1 << 18


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


def _group(epoch: np.ndarray, rank: np.ndarray, batches: np.ndarray | None = None) -> _Groups:
    """Few (epoch, rank) pairs (the usual case) get a dense 16-bit id, which numpy sorts with a
    radix sort; otherwise ids come from np.unique. Either way the permutation is the stable
    sort by (epoch, rank).

    ``batches``: the records per batch, in file order (a batch is one rank's): where the epoch
    too changes only where a batch starts (the usual case), the batches are grouped instead of
    the records (:func:`_group_batches`)."""
    n = len(epoch)
    if n == 0:
        return _Groups(np.zeros(0, dtype=np.uint16), 0, np.zeros(0, dtype=np.intp), [], [])
    if batches is not None and len(batches) < n:
        grouped = _group_batches(epoch, rank, batches)
        if grouped is not None:
            return grouped
    gid, span, counts, present, keys = _group_ids(epoch, rank)
    ends = np.cumsum(counts)
    ids = present.tolist()
    runs = [(key, int(ends[i] - counts[i]), int(ends[i])) for key, i in zip(keys, ids, strict=True)]
    return _Groups(gid, span, np.argsort(gid, kind="stable"), runs, ids)


def _group_ids(
    epoch: np.ndarray, rank: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, list[int]]:
    """(an id per element, ids' span, count per id (``weights`` summed, if given), the ids
    present, their keys epoch << 20 | rank), ids ascending by (epoch, rank)."""
    e0, e1, r0, r1 = int(epoch.min()), int(epoch.max()), int(rank.min()), int(rank.max())
    nr = r1 - r0 + 1
    n = len(epoch)
    if r0 >= 0 and r1 < 1 << 20 and (e1 - e0 + 1) * nr <= 1 << 16:
        span = (e1 - e0 + 1) * nr
        gid: np.ndarray = np.empty(n, dtype=np.uint16)
        wide = np.dtype(np.int64 if max(abs(e0), abs(e1)) >= 1 << 30 else np.int32)  # no overflow below
        for a in range(0, n, BLOCK):
            e = epoch[a : a + BLOCK].astype(wide, copy=False)
            gid[a : a + BLOCK] = (e - e0) * nr + (rank[a : a + BLOCK].astype(wide, copy=False) - r0)
        counts = np.zeros(span, dtype=np.int64)
        for a in range(0, n, BLOCK):  # bincount widens to intp: a block at a time
            w = None if weights is None else weights[a : a + BLOCK]
            counts += np.bincount(gid[a : a + BLOCK], w, minlength=span).astype(np.int64)
        present = np.flatnonzero(counts)
        keys = [((e0 + i // nr) << 20) | (r0 + i % nr) for i in present.tolist()]
    else:
        uniq, inverse = np.unique((epoch.astype(np.int64) << 20) | rank.astype(np.int64), return_inverse=True)
        gid, span = inverse.astype(np.intp).ravel(), len(uniq)
        present, keys = np.arange(span), uniq.tolist()
        counts = np.bincount(gid, weights, minlength=span).astype(np.int64)
    return gid, span, counts, present, keys


def _group_batches(epoch: np.ndarray, rank: np.ndarray, batches: np.ndarray) -> _Groups | None:
    """:func:`_group` by batches (``batches``: records per batch, each one rank's), where the
    epoch changes only where a batch starts, else None. The permutation is each group's
    batches' records in file order, built from the batches' starts (a cumsum over the records)
    instead of a radix sort of a 16-bit id per record: ~3x less time at 10 M records (VM)."""
    n = len(epoch)
    sizes = batches.astype(np.int64, copy=False)
    firsts = np.cumsum(sizes) - sizes
    keep = sizes > 0
    sizes, firsts = sizes[keep], firsts[keep]
    if int(sizes.sum()) != n or len(rank) != n:
        return None
    changes = np.flatnonzero(epoch[1:] != epoch[:-1]) + 1  # few: epochs last seconds
    at_batch = firsts[np.minimum(np.searchsorted(firsts, changes), len(firsts) - 1)] == changes
    if not at_batch.all():
        return None
    gid_b, span, counts, present, keys = _group_ids(epoch[firsts], rank[firsts], sizes)
    by = np.argsort(gid_b, kind="stable")
    b_first, b_size = firsts[by], sizes[by]
    # each record's index: one more than the record before it, except where a batch starts
    order = np.ones(n, dtype=np.intp)
    at = np.cumsum(b_size) - b_size
    order[at[1:]] = b_first[1:] - (b_first[:-1] + b_size[:-1] - 1)
    order[0] = b_first[0]
    np.cumsum(order, out=order)
    ends = np.cumsum(counts)
    ids = present.tolist()
    runs = [(key, int(ends[i] - counts[i]), int(ends[i])) for key, i in zip(keys, ids, strict=True)]
    return _Groups(np.repeat(gid_b, sizes), span, order, runs, ids)


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


#: The epochs' sorts ask from several threads at once: one times, the others wait for it.
_CHOOSING = threading.Lock()


def _placing_is_faster() -> bool:
    """Whether placing the values at the report's percentile positions through a histogram
    (:func:`tui.report.placed.placed`) beats numpy's sort of float32 on this machine, timed
    once per process on 2^16 scrambled values (~3 ms). numpy's sort is a SIMD sort; on an
    AVX-512 Xeon it beat a partition 4x at 10 M values (an H100 host, numpy 2.5.2: sort ~10-13
    ns a value, placing ~12-19), on the 2-core AMD EPYC VM it runs at ~37 ns a value (placing:
    ~8). The results are the same either way."""
    with _CHOOSING:
        return _timed_choice()


@functools.cache
def _timed_choice() -> bool:
    """:func:`_placing_is_faster`'s timing, once per process."""
    values = ((np.arange(1 << 16, dtype=np.uint32) * np.uint32(2654435761)) >> np.uint32(8)).astype(np.float32)
    starts = [0, len(values)]

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    return best(lambda: placed(values, starts, REPORT_QS)) < best(lambda: np.sort(values))


def _in_order(values: np.ndarray, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(each part ``values[starts[i]:starts[i + 1]]`` in order, one array; the whole in order;
    the same array where there is one part), in order where the report reads them: sorted, or,
    where that is faster (:func:`_placing_is_faster`), with the values of the positions of
    :data:`REPORT_QS`, the median and the maximum placed there (unless the values crowd into
    a few bins: then sorted too). Either gives the same percentiles. ``values``: non-negative
    finite float32."""
    if len(values) >= _CHOOSE_AT and _placing_is_faster():
        found = placed(values, starts, REPORT_QS)
        if found is not None:
            return found
    if len(starts) == 2:
        whole = np.sort(values)
        return whole, whole
    by_part = np.empty(len(values), dtype=np.float32)
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        by_part[a:b] = np.sort(values[a:b])
    return by_part, np.sort(by_part)


class _EpochOrder:
    """One epoch's durations sorted once, with each value's rank (index within the epoch) and
    overlap class beside it, so the epoch's, every rank's and every class's percentiles are read
    out in order instead of sorting each subset again (the report's sorts were most of its time).

    An epoch of one class keeps its values in order only where the report reads them
    (:func:`_in_order`), its ranks' likewise; the packed keys (several classes) sort them.

    The sort key packs the float32 bits (their order is the values' order for non-negative
    finite values), the rank index and the class into one uint64; an epoch with a negative,
    NaN or infinite duration, or more than 65,535 ranks, keeps the per-subset sorts (None)."""

    def __init__(self, values: np.ndarray, rank: np.ndarray, cls: np.ndarray, one_class: int | None = None) -> None:
        self.values, self.rank, self.cls = values, rank, cls
        #: The class of every record where they share one (no copies, say): :meth:`group` then
        #: counts nothing (a count per class was a pass over the epoch for every row).
        self.one_class = one_class
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
        """:meth:`of` where every record has the same class: each rank's float32 durations
        (half the bytes of the packed keys) and the epoch's put in order on their own
        (:func:`_in_order`: sorted, or placed where that is faster). Sorted, for
        non-negative finite values the float order is the order of the bits, so the values
        come out exactly as from the keys; equal floats are the same bits, so any sort gives
        the same array. numpy's default float32 sort (SIMD quicksort) took 28 ms on 5 M values
        of 8 sorted runs where the stable sort's merge of those runs took 85 ms (VM, Xeon)."""
        starts = np.cumsum([0, *sizes]).tolist()
        by_rank, values = _in_order(np.ascontiguousarray(dur32, dtype=np.float32), starts)
        order = cls(values, np.zeros(0, dtype=np.uint16), np.full(len(values), ocls, dtype=np.int8), ocls)
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
        ones = {p.one_class for p in parts if p is not None}
        one = ones.pop() if len(ones) == 1 else None
        if one is not None:  # one class: the values alone, in order as in _of_one_class
            values = _in_order(values, [0, len(values)])[1]
            return cls(values, np.zeros(len(values), dtype=np.uint16), np.full(len(values), one, dtype=np.int8), one)
        classes = np.concatenate([p.cls for p in parts if p is not None])
        order = np.argsort(values, kind="stable")  # merges the sorted runs
        return cls(values[order], np.zeros(len(values), dtype=np.uint16), classes[order], one)

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
        if self.one_class is not None:
            return values, {c: values if c == self.one_class else values[:0] for c in (NO_COPIES, DURING, AFTER)}
        out = {}
        for c in (NO_COPIES, DURING, AFTER):
            mine = cls == c
            count = int(np.count_nonzero(mine))
            out[c] = values if count == len(values) else values[mine] if count else values[:0]
        return values, out


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


def _weighted_mean(pairs: Sequence[tuple[float, int]]) -> float:
    """Mean of per-epoch means weighted by their counts, over the finite ones."""
    ok = [(v, n) for v, n in pairs if n > 0 and math.isfinite(v)]
    total = sum(n for _, n in ok)
    return sum(v * n for v, n in ok) / total if total else math.nan
