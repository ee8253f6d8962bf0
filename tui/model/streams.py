"""A run's collectives by *stream*: (process group, op, dtype, size), the rows nccl-tests and NCCL
Inspector show. A user's job mixes gradient buckets, scalar all_reduces and all_to_alls of
several groups; one latency line for all of them says little, one per stream says what each costs.

Records carry the rank's *code* of their group (an index into that rank's ``Hello.groups``); a
stream is named by the group's name and description, never by a code (two ranks may number
the same group differently). Code 0 of a rank that names no groups is the world group, "0".

:class:`StreamTable` keeps whole-run statistics per stream in bounded memory: at most
MAX_STREAMS named streams, the rest pooled in one "other" bucket. A batch costs a fixed number
of numpy calls plus a dict lookup per distinct stream in it, never Python per record. Records
whose group their rank has not named yet wait as *pending* aggregates, merged into their stream
once a Hello names the group. The same naming rules serve the report (:mod:`tui.report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tui.model.stats import RunAggregate, uniform
from workers.wire.protocol import DTYPES, OP_NAMES, Hello

_POINT_TO_POINT = {OP_NAMES.index("send"), OP_NAMES.index("recv")}

#: Named streams kept; records of further streams go to the "other" bucket.
MAX_STREAMS = 64
#: Ring value (per record) of the "other" bucket.
OTHER = MAX_STREAMS
#: Ring value of a record whose group its rank has not named yet.
UNNAMED = 255
#: Records that wait before they join their streams' statistics (a fold costs a sort and an
#: aggregate update per stream, whatever the number of batches in it).
FOLD_RECORDS = 4096
#: Pending (rank, stream) aggregates kept while their groups are not named; more go to "other".
MAX_PENDING = 256
#: Asked for as the stream to draw: the one after the current in table order (then -1: all).
NEXT_STREAM = -2
#: Descriptions torch gives a group nobody described (not worth a label).
_PLAIN_DESCS = ("", "undefined")

#: A group as a rank names it: (name, description, size).
Group = tuple[str, str, int]


#: torch names a group made with ``use_local_synchronization`` by a 40-digit hash of its ranks:
#: tables show its first digits, as git shows a commit.
_HASH_NAME, _HASH_SHOWN = 32, 8


def group_label(name: str, desc: str) -> str:
    """How tables write a group: ``NAME:DESC`` ("0:default_pg"), or ``NAME`` when the
    description says nothing ("undefined", torch's default for ``new_group``); a hash name
    by its first 8 digits and "…"."""
    if len(name) >= _HASH_NAME and all(c in "0123456789abcdef" for c in name):
        name = name[:_HASH_SHOWN] + "…"
    return name if desc in _PLAIN_DESCS else f"{name}:{desc}"


def group_order(name: str) -> tuple[int, int, str]:
    """Sort key of a group name: torch's numbers in number order ("2" before "10"), then names."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


#: Groups a summary or report line names before "+N more".
SUMMARY_GROUPS = 8


def listed(items: Sequence[str], most: int) -> str:
    """``items`` joined by commas, the first ``most`` and "+N more" (a job may make hundreds of
    groups: one line of the header or the summary, never a screenful)."""
    shown = ", ".join(items[:most])
    return shown if len(items) <= most else f"{shown}, +{len(items) - most} more"


def rank_groups(hello: Hello) -> tuple[Group, ...]:
    """The rank's groups by code: its Hello's table, or (a rank that names none: an older worker,
    a recording made before groups) code 0 as the world group "0" of the world size."""
    if hello.groups:
        return hello.groups
    return (("0", "", hello.world_size),)


def op_name(code: int) -> str:
    return OP_NAMES[code] if code < len(OP_NAMES) else f"op{code}"


def dtype_name(code: int, nbytes: int) -> str:
    """The dtype's name; "-" for a call that moves no data (a barrier: no tensor, no dtype),
    "?" where a call's tensor had a dtype commtop does not know."""
    if code == 0 and nbytes == 0:
        return "-"
    return DTYPES[code] if code < len(DTYPES) else f"dtype{code}"


def pack_keys(op: np.ndarray, group: np.ndarray, dtype: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """One uint64 per record for its (group code, op, dtype, size): ``nbytes << 24 | group << 16 |
    op << 8 | dtype`` (group codes past 255 and sizes past 2**40 are clipped: MAX_GROUPS is 256)."""
    packed = np.minimum(nbytes, (1 << 40) - 1).astype(np.uint64) << np.uint64(24)
    packed |= np.minimum(group, 255).astype(np.uint64) << np.uint64(16)
    packed |= op.astype(np.uint64) << np.uint64(8)
    packed |= dtype.astype(np.uint64)
    return packed


#: Ops whose size may differ between the ranks of one call (an uneven all_to_all, a gather's or
#: scatter's root, the two ends of a send): their shape leaves the size out.
_SIZE_FREE = np.zeros(256, dtype=bool)
_SIZE_FREE[[OP_NAMES.index(op) for op in ("all_to_all", "gather", "scatter", "send", "recv")]] = True
_SEND, _RECV = OP_NAMES.index("send"), OP_NAMES.index("recv")


def record_shapes(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per collective record, its (op, dtype, size) hashed to 16 bits: what two ranks' records of
    one collective share whatever their group codes, named or not (the history compares them:
    tui.model.history). A send and the recv it meets are one shape, and an op whose size may
    differ between ranks (an MoE's uneven all_to_all) leaves its size out: else the ranks' k-th
    collectives looked different, as if several threads issued them. Two shapes may share a hash;
    a rank's ring keeps 2 bytes a record."""
    ops = columns["op"]
    nbytes = columns["nbytes"].astype(np.uint64)
    free = _SIZE_FREE[ops]
    if free.any():
        nbytes[free] = 0
        ops = np.where(ops == _RECV, _SEND, ops)
    packed = nbytes ^ (ops.astype(np.uint64) << np.uint64(48))
    packed ^= columns["dtype"].astype(np.uint64) << np.uint64(56)
    return ((packed * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(48)).astype(np.uint16)


def unpack_key(key: int) -> tuple[int, int, int, int]:
    """(group code, op, dtype, nbytes) of a :func:`pack_keys` value."""
    return (key >> 16) & 0xFF, (key >> 8) & 0xFF, key & 0xFF, key >> 24


@dataclass(frozen=True)
class StreamView:
    """One stream, all ranks together, as the UI and the headless summary show it."""

    index: int  # its ring value (OTHER: the "other" bucket; UNNAMED: a group not named yet)
    group: str  # the group's name ("0", "1", ...); "" for "other"; "?CODE" while not named
    group_desc: str
    group_size: int
    op: str  # "other" for the bucket
    dtype: str
    nbytes: int
    count: int = 0
    ranks: int = 0  # ranks that recorded it
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    max_ms: float = math.nan
    busbw_gbps: float = math.nan  # at the average duration, as nccl-tests
    total_ms: float = 0.0  # time in the stream, all ranks
    share: float = math.nan  # total_ms / the ranks' time (first record to last end, summed)
    exact: bool = True

    @property
    def group_text(self) -> str:
        return group_label(self.group, self.group_desc) if self.group else "-"


class _Stream:
    __slots__ = ("agg", "ranks")

    def __init__(self) -> None:
        self.agg = RunAggregate()
        self.ranks: set[int] = set()


class StreamTable:
    """Whole-run statistics per stream, fed one collective batch at a time (ingest thread)."""

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        if not 0 < limit <= MAX_STREAMS:
            raise ValueError(f"limit must be in 1..{MAX_STREAMS}")
        self.limit = limit
        self.reset()

    def reset(self) -> None:
        #: (group name, desc, size, op, dtype, nbytes) of each named stream, by ring value.
        self.keys: list[tuple[str, str, int, int, int, int]] = []
        self._index: dict[tuple[str, int, int, int], int] = {}
        self._streams: dict[int, _Stream] = {}  # by ring value, OTHER too (made on first use)
        self._codes: dict[int, dict[int, int]] = {}  # rank -> packed key -> ring value
        self._pending: dict[tuple[int, int], _Stream] = {}  # (rank, packed key) not named yet
        #: Batches not yet in their streams' statistics: (rank, ring values, dur_us, busbw, the
        #: one ring value of them all or -1).
        self._waiting: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]] = []
        self._waiting_n = 0
        self.version = 0
        self._views: dict[int, tuple[int, StreamView]] = {}  # ring value -> (count, view)
        #: ring value -> the one the history compares across ranks (:meth:`compared`): a stream of
        #: an op whose size may differ between the ranks of one call (an uneven all_to_all, a
        #: send and its recv) compares as the first of its group, op and dtype
        self._compared = np.arange(256, dtype=np.uint8)
        self._size_free: dict[tuple[str, int, int], int] = {}

    @property
    def count(self) -> int:
        """Named streams (the "other" bucket not counted)."""
        return len(self.keys)

    def add(self, rank: int, hello: Hello | None, cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """Take a collective batch of ``rank``. Returns each record's ring value (uint8) and, when
        the whole batch is one stream (the usual case), that value (else -1). The records join
        their streams' statistics FOLD_RECORDS at a time (or when read)."""
        op, group, dtype, nbytes = cols["op"], cols["group"], cols["dtype"], cols["nbytes"]
        n = len(op)
        if n == 0:
            return np.empty(0, dtype=np.uint8), -1
        dur, bw = cols["dur_us"], cols["busbw"]
        if uniform(op) and uniform(group) and uniform(dtype) and uniform(nbytes):
            key = int(min(int(nbytes[0]), (1 << 40) - 1)) << 24 | min(int(group[0]), 255) << 16
            value = self._value(rank, hello, key | int(op[0]) << 8 | int(dtype[0]), dur, bw, None)
            out = np.full(n, value, dtype=np.uint8)
            single = value
        else:  # several streams: one stable sort groups each stream's records into a slice
            packed = pack_keys(op, group, dtype, nbytes)
            order = np.argsort(packed, kind="stable")
            ordered = packed[order]
            firsts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))).tolist()
            bounds = [*firsts, n]
            values = [
                self._value(rank, hello, int(ordered[lo]), dur, bw, order[lo:hi])
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            out = np.empty(n, dtype=np.uint8)
            out[order] = np.repeat(np.array(values, dtype=np.uint8), np.diff(bounds))
            single = -1
        self._waiting.append((rank, out, dur, bw, single))
        self._waiting_n += n
        if self._waiting_n >= FOLD_RECORDS:
            self._fold()
        return out, single

    def _value(
        self, rank: int, hello: Hello | None, key: int, dur: np.ndarray, bw: np.ndarray, take: np.ndarray | None
    ) -> int:
        """The ring value of a stream of ``rank``'s batch (its records: ``take`` of ``dur`` and
        ``bw``, None = all); records of a group the rank has not named yet wait apart, UNNAMED."""
        codes = self._codes.setdefault(rank, {})
        value = codes.get(key, -1)
        if value < 0:
            value = self._resolve(rank, hello, key)
            if value != UNNAMED:
                codes[key] = value
        if value == UNNAMED:
            pending = self._pending.get((rank, key))
            if pending is None and len(self._pending) >= MAX_PENDING:
                return OTHER  # bounded: what no Hello will name in time is "other"
            if pending is None:
                pending = self._pending[(rank, key)] = _Stream()
            pending.agg.add(dur, bw) if take is None else pending.agg.add(dur[take], bw[take])
            pending.ranks.add(rank)
        return value

    def _fold(self) -> None:
        """The waiting batches into their streams' statistics: one sort by ring value (a radix
        sort of bytes), one aggregate update per stream."""
        waiting = self._waiting
        if not waiting:
            return
        self._waiting, self._waiting_n = [], 0
        self.version += 1
        singles = {w[4] for w in waiting}
        if len(singles) == 1 and (value := singles.pop()) >= 0:  # one stream (the usual case): no sort
            if value != UNNAMED:
                stream = self._stream(value)
                stream.agg.add(np.concatenate([w[2] for w in waiting]), np.concatenate([w[3] for w in waiting]))
                stream.ranks.update({w[0] for w in waiting})
            return
        values = np.concatenate([w[1] for w in waiting])
        dur = np.concatenate([w[2] for w in waiting])
        bw = np.concatenate([w[3] for w in waiting])
        ranks = np.repeat(np.array([w[0] for w in waiting]), [len(w[1]) for w in waiting])
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        bounds = [*np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))).tolist(), len(values)]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            value = int(ordered[lo])
            if value == UNNAMED:
                continue  # already with their pending (rank, key)
            take = order[lo:hi]
            stream = self._stream(value)
            stream.agg.add(dur[take], bw[take])
            stream.ranks.update(np.unique(ranks[take]).tolist())

    def _stream(self, value: int) -> _Stream:
        stream = self._streams.get(value)
        if stream is None:
            stream = self._streams[value] = _Stream()
        return stream

    def _resolve(self, rank: int, hello: Hello | None, key: int) -> int:
        """The ring value of ``key`` on ``rank``: its stream (created while there is room, else
        OTHER), or UNNAMED while the rank has not named the group."""
        code, op, dtype, nbytes = unpack_key(key)
        groups = rank_groups(hello) if hello is not None else ()
        if code >= len(groups):
            return UNNAMED
        name, desc, size = groups[code]
        ident = (name, op, dtype, nbytes)
        value = self._index.get(ident)
        if value is None:
            if len(self.keys) >= self.limit:
                return OTHER
            value = self._index[ident] = len(self.keys)
            self.keys.append((name, desc, size, op, dtype, nbytes))
            if _SIZE_FREE[op]:
                like = (name, _SEND if op == _RECV else op, dtype)
                self._compared[value] = self._size_free.setdefault(like, value)
        return value

    def compared(self, streams: np.ndarray) -> np.ndarray:
        """The streams the history compares across ranks (ring values): an op whose size may
        differ between the ranks of one call compares by its group, op and dtype alone."""
        return self._compared[streams] if self._size_free else streams

    def named(self, rank: int, hello: Hello) -> list[tuple[int, int]]:
        """A Hello of ``rank`` arrived: its pending records whose groups it now names join their
        streams. Returns (ring value, records) moved, so the rank's per-stream counts follow."""
        moved = []
        if any(k[0] == rank for k in self._pending):
            self._fold()
        for rk, key in [k for k in self._pending if k[0] == rank]:
            value = self._resolve(rank, hello, key)
            if value == UNNAMED:
                continue
            pending = self._pending.pop((rk, key))
            self._codes.setdefault(rank, {})[key] = value
            stream = self._stream(value)
            stream.agg.merge(pending.agg)
            stream.ranks.add(rank)
            moved.append((value, pending.agg.count))
            self.version += 1
        return moved

    def order(self) -> list[int]:
        """The named streams' ring values in table order (group, op, dtype, size)."""
        return sorted(
            range(len(self.keys)),
            key=lambda v: (
                group_order(self.keys[v][0]),
                group_label(*self.keys[v][:2]),
                op_name(self.keys[v][3]),
                dtype_name(self.keys[v][4], self.keys[v][5]),
                self.keys[v][5],
            ),
        )

    def after(self, value: int) -> int:
        """The stream after ``value`` in table order; -1 (every collective) after the last."""
        values = self.order()
        if value not in values:
            return values[0] if values else -1
        i = values.index(value) + 1
        return values[i] if i < len(values) else -1

    def ranks_aligned(self, world_size: int) -> bool:
        """Whether the k-th collective of every rank is the same collective, as the history's
        iterations assume (arrival skew, straggler): no stream on a group smaller than the world
        (its members issue collectives the others do not), no point-to-point, no "other" bucket.
        A group not named yet does not count until it is."""
        if self._other_count() or any(op in _POINT_TO_POINT for _, _, _, op, _, _ in self.keys):
            return False
        return all(size in (0, world_size) for _, _, size, _, _, _ in self.keys)

    def _other_count(self) -> int:
        """Records in the "other" bucket (streams past the ring's 254 named ones)."""
        other = self._streams.get(OTHER)
        return other.agg.count if other is not None else 0

    def views(self, rank_time_ns: float, cached: bool = True) -> tuple[StreamView, ...]:
        """Every stream with records, named ones by (group, op, dtype, size), then groups not named
        yet, then "other". ``rank_time_ns``: the ranks' time (the share's denominator). A stream's
        percentiles are recomputed only when it has new records (``cached``)."""
        self._fold()
        out: list[StreamView] = []
        for value, (name, desc, size, op, dtype, nbytes) in enumerate(self.keys):
            view = self._view(value, self._stream(value), name, desc, size, op, dtype, nbytes, rank_time_ns, cached)
            if view is not None:
                out.append(view)
        out.sort(key=lambda v: (group_order(v.group), v.group_text, v.op, v.dtype, v.nbytes))
        out += self._pending_views(rank_time_ns)
        other = self._view(OTHER, self._stream(OTHER), "", "", 0, -1, 0, 0, rank_time_ns, cached)
        if other is not None:
            out.append(other)
        return tuple(out)

    def _view(
        self,
        value: int,
        stream: _Stream,
        name: str,
        desc: str,
        size: int,
        op: int,
        dtype: int,
        nbytes: int,
        rank_time_ns: float,
        cached: bool,
    ) -> StreamView | None:
        count = stream.agg.count
        if not count:
            return None
        kept = self._views.get(value)
        if cached and kept is not None and kept[0] == count:
            return _with_share(kept[1], rank_time_ns)
        st = stream.agg.stats()
        view = StreamView(
            index=value,
            group=name,
            group_desc=desc,
            group_size=size,
            op="other" if op < 0 else op_name(op),
            dtype="" if op < 0 else dtype_name(dtype, nbytes),
            nbytes=nbytes,
            count=st.count,
            ranks=len(stream.ranks),
            p50_ms=st.p50_ms,
            p99_ms=st.p99_ms,
            max_ms=st.max_ms,
            busbw_gbps=st.busbw_gbps,
            total_ms=stream.agg.sum_us / 1e3,
            exact=st.exact,
        )
        self._views[value] = (count, view)
        return _with_share(view, rank_time_ns)

    def _pending_views(self, rank_time_ns: float) -> list[StreamView]:
        """Records of groups not named yet, pooled by (code, op, dtype, size) over the ranks."""
        pooled: dict[int, tuple[RunAggregate, set[int]]] = {}
        for (rank, key), pending in self._pending.items():
            agg, ranks = pooled.setdefault(key, (RunAggregate(), set()))
            agg.merge(pending.agg)
            ranks.add(rank)
        out = []
        for key, (agg, ranks) in sorted(pooled.items()):
            code, op, dtype, nbytes = unpack_key(key)
            st = agg.stats()
            view = StreamView(
                UNNAMED,
                f"?{code}",
                "",
                0,
                op_name(op),
                dtype_name(dtype, nbytes),
                nbytes,
                st.count,
                len(ranks),
                st.p50_ms,
                st.p99_ms,
                st.max_ms,
                st.busbw_gbps,
                agg.sum_us / 1e3,
                exact=st.exact,
            )
            out.append(_with_share(view, rank_time_ns))
        return out


def _with_share(view: StreamView, rank_time_ns: float) -> StreamView:
    share = view.total_ms * 1e6 / rank_time_ns if rank_time_ns > 0 else math.nan
    if share == view.share or (math.isnan(share) and math.isnan(view.share)):
        return view
    new = object.__new__(StreamView)
    new.__dict__.update(view.__dict__)
    new.__dict__["share"] = share
    return new


def groups_and_ops(streams: Sequence[StreamView]) -> tuple[list[str], list[str]]:
    """The groups ("0:default_pg (4)": label and size) and ops of named streams, in table order."""
    groups: dict[str, int] = {}
    ops: dict[str, None] = {}
    for s in streams:
        if s.index == OTHER:
            continue
        groups.setdefault(s.group_text, s.group_size)
        ops.setdefault(s.op, None)
    return [f"{g} ({n})" if n else g for g, n in groups.items()], list(ops)


__all__ = [
    "MAX_STREAMS",
    "OTHER",
    "UNNAMED",
    "StreamTable",
    "StreamView",
    "group_label",
    "group_order",
    "groups_and_ops",
    "listed",
    "pack_keys",
    "rank_groups",
]
