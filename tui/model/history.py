"""The per-rank latency history as a ranks x iterations matrix, written as batches arrive.

Building the sparklines' and heat map's history afresh for every snapshot cost O(ranks x
iterations) of copying out of every rank's ring (300-500 ms per snapshot at 512 ranks on a
2-core VM). Here each collective batch is scattered into a ring of columns (column = iteration
modulo the width) when it is applied, so a snapshot only copies one contiguous matrix out.

The result is the same as building it from the rings: column j of a snapshot is iteration
``first + j`` for the newest ``width`` iterations any rank reached; NaN / NO_MODE where a rank
has no record; ``start_ns`` per iteration from the lowest rank that has it.

Each column also keeps what its first record was: its *shape* (op, dtype, size: the same on
every rank) and its stream (tui.model.streams ring value, once its rank named the group). A
record of another shape, or of another named stream, in the same column means the ranks' k-th
collectives differ (:attr:`HistoryMatrix.interleaved`): a job that issues collectives from
several threads orders them differently on each rank, and iterations then do not line up
across ranks (arrival skew, straggler). Within one process group every rank issues the same
order, so per-stream occurrences still do (``RunState.stream_history_matrix``). The shape is
what tells most threads apart early: a group is named by the rank's next Hello (every second),
and a short job's records may all come before it.

The model queues its batches (:meth:`HistoryMatrix.queue`) and the matrix scatters all of them
at once when it is read (every snapshot) or when PENDING_BATCHES are waiting: numpy's cost per
call, not per record, was most of the scatter (64 ranks send ~40 batches between two snapshots,
512 ranks ~90), and the result is the one the batches added one by one give.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tui.model.streams import UNNAMED  # a group not named yet: its stream is not compared

#: Mode value where a rank has no record for an iteration (as in tui.model.snapshot.History).
NO_MODE = 255
#: Larger than any row index: "no rank gave this column its start time yet".
_NO_ROW = np.iinfo(np.int32).max
#: A column no (named) record reached yet.
_NO_STREAM = -1
_NO_SHAPE = -1
#: Batches queued before they are scattered even if nobody reads the matrix (bounded memory).
PENDING_BATCHES = 256

#: The columns a batch carries for :meth:`HistoryMatrix._compare` (the model's batches and
#: rings carry both; a stream's own history has neither: it compares nothing).
_KINDS = ("stream", "shape")

_Queued = tuple[int, Mapping[str, np.ndarray], int, int]  # row, columns, lowest and highest iteration


class HistoryMatrix:
    """``rows`` ranks (in display order) x ``width`` newest iterations, as ring columns."""

    def __init__(self, ranks: list[int], width: int) -> None:
        if width <= 0:
            raise ValueError("history width must be positive")
        self.ranks = list(ranks)
        self.row_of = {r: i for i, r in enumerate(self.ranks)}
        self.width = width
        n = len(self.ranks)
        self.ms = np.full((n, width), np.nan, dtype=np.float32)
        self.mode = np.full((n, width), NO_MODE, dtype=np.uint8)
        self.start_ns = np.zeros(width, dtype=np.int64)
        self.start_row = np.full(width, _NO_ROW, dtype=np.int32)
        self.last = -1  # newest iteration any rank reached (-1: none yet)
        #: Per column, the stream of the first named record scattered into it (_NO_STREAM: none)
        #: and the shape (tui.model.streams.record_shapes) of its first record (_NO_SHAPE: none).
        self.stream = np.full(width, _NO_STREAM, dtype=np.int16)
        self.shape = np.full(width, _NO_SHAPE, dtype=np.int32)
        #: Records whose shape or stream differed from their column's (0 while every rank's k-th
        #: collective is the same); only batches that carry "stream" and "shape" columns count.
        self.interleaved = 0
        self._queued: list[_Queued] = []
        #: The newest iteration queued per row since the last scatter: a batch at or below it
        #: repeats iterations (a restarted rank), and the queue is then added batch by batch.
        self._queued_top: dict[int, int] = {}
        self._in_order = True

    def _advance(self, last: int) -> None:
        """Make iteration ``last`` the newest: clear the columns of the iterations it reuses."""
        if last <= self.last:
            return
        lo = max(self.last + 1, last - self.width + 1)
        slots = np.arange(lo, last + 1) % self.width
        self.ms[:, slots] = np.nan
        self.mode[:, slots] = NO_MODE
        self.start_ns[slots] = 0
        self.start_row[slots] = _NO_ROW
        self.stream[slots] = _NO_STREAM
        self.shape[slots] = _NO_SHAPE
        self.last = last

    def add(self, rank: int, columns: Mapping[str, np.ndarray]) -> bool:
        """Scatter one collective batch of ``rank``; False if the rank has no row here."""
        row = self.row_of.get(rank)
        if row is None:
            return False
        it = columns["iteration"]
        if len(it) == 0:
            return True
        self._advance(int(it.max()))
        keep = it > self.last - self.width
        if not keep.all():
            it = it[keep]
            columns = {k: columns[k][keep] for k in ("dur_us", "mode", "start_ns", *_KINDS) if k in columns}
        slots = (it % self.width).astype(np.intp)
        kinds = all(k in columns for k in _KINDS)
        again = ~np.isnan(self.ms[row, slots]) if kinds else None  # read before the write
        self.ms[row, slots] = columns["dur_us"] / np.float32(1e3)
        self.mode[row, slots] = columns["mode"]
        if again is not None:
            at, streams, shapes = slots, columns["stream"], columns["shape"]
            if len(at) > 1:
                # one batch holding an iteration twice (a rebuild from the ring of a restarted
                # rank): only the newest record of each is compared, as only it is drawn
                _, last = np.unique(at[::-1], return_index=True)
                if len(last) < len(at):
                    newest = np.sort(len(at) - 1 - last)
                    at, streams, shapes, again = at[newest], streams[newest], shapes[newest], again[newest]
            self._compare(at, streams, shapes, again)
        start = columns["start_ns"]
        better = (self.start_row[slots] >= row) & (start != 0)
        if better.any():
            take = slots[better]
            self.start_ns[take] = start[better]
            self.start_row[take] = row
        return True

    def queue(self, rank: int, columns: Mapping[str, np.ndarray], lo: int, hi: int) -> bool:
        """Add one collective batch of ``rank`` (iterations ``lo``..``hi``) at the next read;
        False if the rank has no row here. The batch's arrays are kept, not copied: the caller
        must not write them afterwards (decoded batches are never written)."""
        row = self.row_of.get(rank)
        if row is None:
            return False
        if len(columns["iteration"]) == 0:
            return True
        top = self._queued_top.get(row)
        if top is not None and lo <= top:
            self._in_order = False
        self._queued_top[row] = hi if top is None else max(top, hi)
        self._queued.append((row, columns, lo, hi))
        if len(self._queued) >= PENDING_BATCHES:
            self.flush()
        return True

    def flush(self) -> None:
        """Scatter the queued batches: one set of numpy calls for all of them, or one batch at
        a time where a row's batches repeat iterations (the newest record must win)."""
        queued, in_order = self._queued, self._in_order
        if not queued:
            return
        self._queued, self._queued_top, self._in_order = [], {}, True
        if len(queued) == 1 or not in_order:
            for row, columns, _, _ in queued:
                self.add(self.ranks[row], columns)
            return
        self._advance(max(hi for _, _, _, hi in queued))
        floor = self.last - self.width  # iterations at or below are outside the window
        parts = [q for q in queued if q[3] > floor]
        if not parts:
            return
        kinds = all(k in c for _, c, _, _ in parts for k in _KINDS)
        streams = np.concatenate([c["stream"] for _, c, _, _ in parts]) if kinds else None
        shapes = np.concatenate([c["shape"] for _, c, _, _ in parts]) if kinds else None
        it = np.concatenate([c["iteration"] for _, c, _, _ in parts])
        dur = np.concatenate([c["dur_us"] for _, c, _, _ in parts])
        mode = np.concatenate([c["mode"] for _, c, _, _ in parts])
        start = np.concatenate([c["start_ns"] for _, c, _, _ in parts])
        rows = np.repeat(
            np.array([row for row, _, _, _ in parts], dtype=np.intp), [len(c["iteration"]) for _, c, _, _ in parts]
        )
        if any(lo <= floor for _, _, lo, _ in parts):
            keep = it > floor
            it, dur, mode, start, rows = it[keep], dur[keep], mode[keep], start[keep], rows[keep]
            if streams is not None and shapes is not None:
                streams, shapes = streams[keep], shapes[keep]
        slots = (it % self.width).astype(np.intp)
        again = ~np.isnan(self.ms[rows, slots]) if streams is not None else None  # read before the write
        self.ms[rows, slots] = dur / np.float32(1e3)
        self.mode[rows, slots] = mode
        self._take_starts(rows, slots, start)
        if streams is not None and shapes is not None and again is not None:
            self._compare(slots, streams, shapes, again)

    def _compare(self, slots: np.ndarray, streams: np.ndarray, shapes: np.ndarray, again: np.ndarray) -> None:
        """Give fresh columns their shape (and stream, from the first named record) and count the
        records whose shape, or named stream, differs from their column's. Several records may
        land in one fresh column at once: one of them sets it (numpy keeps the last), and the
        others are compared with that one. ``again``: records of an iteration their row already
        had (a rank torchrun restarted numbers its collectives from 0 again): they start their
        columns afresh, compared with nothing (the others' records there are the old run's)."""
        if again.any():
            at = slots[again]
            self.shape[at] = shapes[again]
            self.stream[at] = np.where(streams[again] != UNNAMED, streams[again], _NO_STREAM)
            new = ~again
            slots, streams, shapes = slots[new], streams[new], shapes[new]
        fresh = self.shape[slots] == _NO_SHAPE
        if fresh.any():
            self.shape[slots[fresh]] = shapes[fresh]
        differ = self.shape[slots] != shapes
        named = streams != UNNAMED
        if named.any():
            at, values = slots[named], streams[named]
            unset = self.stream[at] == _NO_STREAM
            if unset.any():
                self.stream[at[unset]] = values[unset]
            differ[named] |= self.stream[at] != values
        self.interleaved += int(np.count_nonzero(differ))

    def _take_starts(self, rows: np.ndarray, slots: np.ndarray, start: np.ndarray) -> None:
        """Each column's start time from the lowest row that has one (rows of one batch each
        own their slots: the queue was in order), as ``add`` keeps it batch by batch."""
        given = start != 0
        if not given.all():
            rows, slots, start = rows[given], slots[given], start[given]
        if not len(rows):
            return
        lowest = self.start_row.copy()
        np.minimum.at(lowest, slots, rows.astype(np.int32))
        win = lowest[slots] == rows
        self.start_ns[slots[win]] = start[win]
        self.start_row[slots[win]] = rows[win]

    def window(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(first iteration, ms, mode, start_ns) of the newest ``width`` iterations, oldest
        first, as copies the caller may keep (the queued batches scattered first)."""
        self.flush()
        if self.last < 0:
            n = len(self.ranks)
            return 0, np.full((n, 0), np.nan, np.float32), np.zeros((n, 0), np.uint8), np.zeros(0, np.int64)
        first = max(0, self.last - self.width + 1)
        a, b = first % self.width, self.last % self.width + 1
        if a < b:  # contiguous (no wrap)
            return first, self.ms[:, a:b].copy(), self.mode[:, a:b].copy(), self.start_ns[a:b].copy()
        return (
            first,
            np.concatenate((self.ms[:, a:], self.ms[:, :b]), axis=1),
            np.concatenate((self.mode[:, a:], self.mode[:, :b]), axis=1),
            np.concatenate((self.start_ns[a:], self.start_ns[:b])),
        )
