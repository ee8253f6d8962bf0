"""One epoch's durations sorted by (stream, duration), once per rank and once for all ranks, so
every (rank, stream) row and every (all ranks, stream) row reads its sorted durations, and each
overlap class's, as a slice: the per-stream counterpart of :class:`tui.report.kernels._EpochOrder`.

Only epochs of several streams need it (the synthetic loop runs one). The key packs the stream
code, the float32 bits of the duration (their order is the values' order for non-negative finite
values) and the overlap class into one uint64: ``code << 34 | bits << 2 | class``. Each rank's
run is sorted on its own; the epoch's is the merge of those sorted runs (a stable sort merges
runs). An epoch with a negative, NaN or infinite duration keeps per-subset sorts (None).
"""

from __future__ import annotations

import numpy as np

#: Stream codes that fit the key (codes come from tui.report.streams: at most one per stream).
MAX_CODE = 1 << 30
_BITS_MASK = np.uint64(0xFFFFFFFF)

#: (sorted durations as float32, their overlap classes) of one (rank or all, stream).
Part = tuple[np.ndarray, np.ndarray]


class StreamOrder:
    """Sorted (stream, duration, class) keys of one epoch: per rank, and for all ranks."""

    def __init__(self, by_rank: np.ndarray, starts: list[int], merged: np.ndarray) -> None:
        self.by_rank, self.starts, self.merged = by_rank, starts, merged

    @classmethod
    def of(cls, dur32: np.ndarray, code: np.ndarray, ocls: np.ndarray, sizes: list[int]) -> StreamOrder | None:
        """``dur32``/``code``/``ocls`` of the epoch's records grouped by rank (``sizes`` each)."""
        if not len(dur32) or int(code.max()) >= MAX_CODE:
            return None
        bits = np.ascontiguousarray(dur32, dtype=np.float32).view(np.uint32)
        if int(bits.max()) >= 0x7F800000:  # inf, NaN, or the sign bit set
            return None
        keys = code.astype(np.uint64) << np.uint64(34)
        keys |= bits.astype(np.uint64) << np.uint64(2)
        keys |= ocls.astype(np.uint64)
        starts = np.cumsum([0, *sizes]).tolist()
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            keys[a:b].sort()
        merged = keys if len(sizes) == 1 else np.sort(keys, kind="stable")  # merges the sorted runs
        return cls(keys, starts, merged)

    @classmethod
    def union(cls, orders: list[StreamOrder | None]) -> StreamOrder | None:
        """Several epochs' orders as one (all ranks of all of them; no per-rank parts): their
        sorted keys merged by a stable sort; None if one has no order."""
        if not orders or any(o is None for o in orders):
            return None
        keys = [o.merged for o in orders if o is not None]
        merged = keys[0] if len(keys) == 1 else np.sort(np.concatenate(keys), kind="stable")
        return cls(merged[:0], [0, 0], merged)

    def parts(self, index: int) -> dict[int, Part]:
        """{stream code: (sorted durations, classes)} of rank ``index`` (-1: all ranks)."""
        keys = self.merged if index < 0 else self.by_rank[self.starts[index] : self.starts[index + 1]]
        if not len(keys):
            return {}
        codes = (keys >> np.uint64(34)).astype(np.int64)
        edges = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), len(keys)]
        values = ((keys >> np.uint64(2)) & _BITS_MASK).astype(np.uint32).view(np.float32)
        classes = (keys & np.uint64(3)).astype(np.int8)
        return {int(codes[a]): (values[a:b], classes[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)}


def unsorted_parts(dur32: np.ndarray, code: np.ndarray, ocls: np.ndarray) -> dict[int, Part]:
    """{stream code: (durations, classes)} in record order (an epoch without a StreamOrder)."""
    order = np.argsort(code, kind="stable")
    c = code[order]
    edges = [0, *(np.flatnonzero(c[1:] != c[:-1]) + 1).tolist(), len(c)]
    return {
        int(c[a]): (dur32[order[a:b]], ocls[order[a:b]].astype(np.int8))
        for a, b in zip(edges[:-1], edges[1:], strict=True)
        if b > a
    }
