"""The per-rank latency history as a ranks x iterations matrix, written as batches arrive.

Building the sparklines' and heat map's history afresh for every snapshot cost O(ranks x
iterations) of copying out of every rank's ring (300-500 ms per snapshot at 512 ranks on a
2-core VM). Here each collective batch is scattered into a ring of columns (column = iteration
modulo the width) when it is applied, so a snapshot only copies one contiguous matrix out.

The result is the same as building it from the rings: column j of a snapshot is iteration
``first + j`` for the newest ``width`` iterations any rank reached; NaN / NO_MODE where a rank
has no record; ``start_ns`` per iteration from the lowest rank that has it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Mode value where a rank has no record for an iteration (as in tui.model.snapshot.History).
NO_MODE = 255
#: Larger than any row index: "no rank gave this column its start time yet".
_NO_ROW = np.iinfo(np.int32).max


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
            columns = {k: columns[k][keep] for k in ("dur_us", "mode", "start_ns")}
        slots = (it % self.width).astype(np.intp)
        self.ms[row, slots] = columns["dur_us"] / np.float32(1e3)
        self.mode[row, slots] = columns["mode"]
        start = columns["start_ns"]
        better = (self.start_row[slots] >= row) & (start != 0)
        if better.any():
            take = slots[better]
            self.start_ns[take] = start[better]
            self.start_row[take] = row
        return True

    def window(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(first iteration, ms, mode, start_ns) of the newest ``width`` iterations, oldest
        first, as copies the caller may keep."""
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
