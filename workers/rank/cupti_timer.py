"""Timers fed by CUPTI activity records: nothing on the GPU stream, one list store per record
on the loop thread (torch-free; the CUPTI client is :mod:`workers.rank.cupti_activity`).

The loop thread's :meth:`CuptiTimer.begin` only writes the record's meta into a ring slot;
the GPU's own records of the same work (a NCCL kernel, or at world size 1 the DtoD memcpy
NCCL issues; a side-stream memcpy for a copy) arrive from CUPTI in stream order and are
matched to the metas by count: the n-th collective record after set-up is the n-th
collective begun. :func:`learn_collective` finds, at set-up, which stream and which record
signature (kernel name, or memcpy kind and size) one collective leaves, and how many records.
Records with other signatures (a barrier, a delay kernel) are not counted.

The ring is lock-free: ``begin`` bumps ``issued`` before it writes the slot, so the harvester
can tell a slot the loop has since reused (more than ``capacity`` records behind) and counts
that record untimed instead of giving it another record's meta.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.rank.cupti_activity import (
    KIND_MEMCPY,
    MEMCPY_DTOD,
    MEMCPY_DTOH,
    MEMCPY_HTOD,
    CuptiActivity,
    Decoded,
)

Row = tuple[Any, ...]
#: Collectives issued at set-up to learn their records.
LEARN_OPS = 4
CLOCK_EVERY_NS = 1_000_000_000
#: How often the harvester asks CUPTI for the records of a buffer not yet full.
FLUSH_EVERY_NS = 50_000_000


@dataclass(frozen=True)
class CollectiveSignature:
    """What one collective leaves in CUPTI: ``per_op`` records on ``stream_id`` whose
    (kind, kernel name or memcpy size) is in ``keys``."""

    stream_id: int
    per_op: int
    keys: frozenset[tuple[int, Any]]


@dataclass
class _Spans:
    """Start/end (CUPTI ns) of one category's records not yet matched, in stream order."""

    parts: deque[tuple[np.ndarray, np.ndarray]] = field(default_factory=deque)

    def add(self, start: np.ndarray, end: np.ndarray) -> None:
        if len(start):
            self.parts.append((start, end))

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        parts = self.parts
        if not parts:
            return np.empty(0, np.uint64), np.empty(0, np.uint64)
        got = [parts.popleft() for _ in range(len(parts))]
        if len(got) == 1:
            return got[0]
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])


def _kernel_keys(d: Decoded, names: Any) -> list[tuple[int, Any]]:
    return [(10, names(int(p))) for p in d.kernel["name"]]


def _memcpy_keys(d: Decoded) -> list[tuple[int, Any]]:
    return [(KIND_MEMCPY, (int(k), int(b))) for k, b in zip(d.memcpy["copy_kind"], d.memcpy["bytes"], strict=True)]


def is_collective_record(kind: int, key: Any) -> bool:
    """NCCL's own kernels, or the device-to-device memcpy it issues for a world of one."""
    if kind == KIND_MEMCPY:
        return int(key[0]) == MEMCPY_DTOD
    return str(key).startswith("nccl")


def signature_from(decoded: Iterable[Decoded], since: int, ops: int, names: Any) -> CollectiveSignature | None:
    """The signature of ``ops`` identical collectives run after CUPTI time ``since``, or
    None when their records do not tell one collective from the next (none at all, several
    streams, or a count that is not a multiple of ``ops``)."""
    by_stream: dict[int, list[tuple[int, Any]]] = {}
    for d in decoded:
        for keys, spans in ((_kernel_keys(d, names), d.kernel), (_memcpy_keys(d), d.memcpy)):
            for (kind, key), start, sid in zip(keys, spans["start"], spans["stream_id"], strict=True):
                if int(start) >= since and is_collective_record(kind, key):
                    by_stream.setdefault(int(sid), []).append((kind, key))
    if len(by_stream) != 1:
        return None
    ((sid, recs),) = by_stream.items()
    if not recs or len(recs) % ops:
        return None
    return CollectiveSignature(sid, len(recs) // ops, frozenset(recs))


def learn_collective(
    cupti: CuptiActivity, run_collective: Callable[[], Any], synchronize: Callable[[], Any], ops: int = LEARN_OPS
) -> CollectiveSignature | None:
    """Run ``ops`` collectives at set-up (a host sync is allowed here) and read their records."""
    synchronize()
    cupti.flush(forced=True)
    cupti.take()
    since = cupti.timestamp()
    for _ in range(ops):
        run_collective()
    synchronize()
    decoded: list[Decoded] = []
    deadline = time.monotonic() + 2.0
    while True:  # a forced flush may hand buffers over on CUPTI's own thread
        cupti.flush(forced=True)
        decoded += cupti.take()
        sig = signature_from(decoded, since, ops, cupti.kernel_name)
        if sig is not None or time.monotonic() > deadline:
            return sig
        time.sleep(0.02)


class CuptiFeed:
    """Splits the CUPTI client's buffers into collective and copy spans for the timers, and
    maps CUPTI time onto ``time.time_ns()`` (re-read every ``CLOCK_EVERY_NS``: the two clocks
    drift apart by microseconds per second). Both timers harvest on one thread; whichever
    harvests first polls."""

    def __init__(self, cupti: CuptiActivity, signature: CollectiveSignature, since: int) -> None:
        self.cupti = cupti
        self.sig = signature
        self.since = since
        self.offset_ns = 0
        self._clock_at = 0
        self._flushed_at = 0
        self.sync_clock()
        self.collectives = _Spans()
        self.copies = _Spans()

    def sync_clock(self) -> None:
        a = time.time_ns()
        c = self.cupti.timestamp()
        b = time.time_ns()
        self.offset_ns = (a + b) // 2 - c
        self._clock_at = b

    def poll(self) -> None:
        now = time.time_ns()
        if now - self._clock_at > CLOCK_EVERY_NS:
            self.sync_clock()
        if now - self._flushed_at > FLUSH_EVERY_NS:
            self._flushed_at = now
            self.cupti.flush()  # completed records of the current buffer, without waiting
        sig = self.sig
        for d in self.cupti.take():
            k = d.kernel
            if len(k["start"]):
                keep = (k["stream_id"] == sig.stream_id) & (k["start"] >= self.since)
                if keep.any():
                    names = [(10, self.cupti.kernel_name(int(p))) in sig.keys for p in k["name"]]
                    keep &= np.asarray(names, dtype=bool)
                    self.collectives.add(k["start"][keep], k["end"][keep])
            m = d.memcpy
            if len(m["start"]):
                later = m["start"] >= self.since
                on_coll = (m["stream_id"] == sig.stream_id) & later
                if on_coll.any():
                    keys = [
                        (KIND_MEMCPY, (int(a), int(b))) in sig.keys
                        for a, b in zip(m["copy_kind"], m["bytes"], strict=True)
                    ]
                    coll = on_coll & np.asarray(keys, dtype=bool)
                    self.collectives.add(m["start"][coll], m["end"][coll])
                ck = m["copy_kind"]
                cp = later & (m["stream_id"] != sig.stream_id) & ((ck == MEMCPY_DTOH) | (ck == MEMCPY_HTOD))
                self.copies.add(m["start"][cp], m["end"][cp])


class CuptiTimer:
    """The :class:`~workers.rank.timing.Timer` of one category (``"collectives"`` or
    ``"copies"``): ``begin`` stores the meta, the GPU's records give start and duration."""

    def __init__(self, feed: CuptiFeed, category: str, capacity: int, per_op: int = 1) -> None:
        self.feed = feed
        self.spans: _Spans = getattr(feed, category)
        self.capacity = capacity
        self.per_op = per_op
        self.meta: list[Row] = [()] * capacity
        self.issued = 0  # written by the loop thread only
        self.matched = 0  # operations whose records arrived (harvest thread only)
        self.untimed = 0
        self.unmatched = 0  # records that arrived with no begin for them (should stay 0)
        self._carry_s = np.empty(0, np.uint64)
        self._carry_e = np.empty(0, np.uint64)

    def begin(self, meta: Row) -> None:
        k = self.issued
        self.issued = k + 1
        self.meta[k % self.capacity] = meta

    def end(self, token: Any) -> None:
        pass

    def pending_records(self) -> int:
        return sum(len(p[0]) for p in self.spans.parts) + len(self._carry_s)

    def settle(self, timeout_s: float = 1.0) -> None:
        """At the end (the GPU is idle): have CUPTI hand over every record still buffered."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.feed.cupti.flush(forced=True)
            self.feed.poll()
            if self.matched + self.pending_records() // self.per_op >= self.issued or time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def harvest(self, out: list[Row]) -> None:
        self.feed.poll()
        s, e = self.spans.take()
        if len(self._carry_s):
            s, e = np.concatenate([self._carry_s, s]), np.concatenate([self._carry_e, e])
        per = self.per_op
        n_ops = len(s) // per
        rest = len(s) - n_ops * per
        self._carry_s, self._carry_e = (s[len(s) - rest :], e[len(e) - rest :]) if rest else (s[:0], e[:0])
        if not n_ops:
            return
        if per > 1:
            starts = s[: n_ops * per : per]
            ends = e[per - 1 : n_ops * per : per]
        else:
            starts, ends = s, e
        offset = self.feed.offset_ns
        start_ns = (starts.astype(np.int64) + offset).tolist()
        dur_us = ((ends.astype(np.int64) - starts.astype(np.int64)) / 1000.0).tolist()
        cap, meta = self.capacity, self.meta
        k = self.matched
        append = out.append
        for i in range(n_ops):
            issued = self.issued
            if k >= issued:
                self.unmatched += 1
            elif issued - k > cap:
                self.untimed += 1
            else:
                m = meta[k % cap]
                if self.issued - k > cap:  # reused while read
                    self.untimed += 1
                else:
                    append((*m, start_ns[i], dur_us[i]))
            k += 1
        self.matched = k
