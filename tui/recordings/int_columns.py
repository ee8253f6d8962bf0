"""Integer columns stored per chunk, decoded over many chunks at once.

A chunk stores each column as ``(delta, first, base, width, payload, n)``
(:func:`tui.recordings.codec._enc_int`: frame of reference over the values or their deltas,
narrowed to ``width`` bytes and byte-shuffled). Here: one numpy pass per column over a run of
chunks (:func:`decode_ints`), into a slice of a column when the column is decoded in pieces
(:func:`runs_of_chunks`), and a column left encoded that is read at a few records
(:class:`ColumnAt`). :mod:`tui.recordings.bulk` checks the encodings before they come here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

Enc = tuple[int, int, int, int, bytes, int]  # delta, first, base, width, payload, n


def decode_ints(encs: Sequence[Enc], width: int = 8, out: np.ndarray | None = None) -> np.ndarray:
    """The values of one column over many chunks (all delta, or all plain), in order: what
    ``codec._dec_int`` gives for each, concatenated, modulo 2**(8*width) as unsigned
    ``width``-byte ints (the per-chunk decoder's int64 wraps, so its low bytes are these);
    written into ``out`` (a contiguous array of as many ``width``-byte items) when given.

    Every chunk's byte planes are joined into the output (a chunk's first value left 0 for
    a delta column), the bases added, each chunk's first replaced by its step from the previous
    chunk's last value, and one cumsum over the whole column restores the values. A chunk's
    first value is stored whole, so any run of chunks decodes on its own (:func:`runs_of_chunks`)."""
    dtype = _UINT[width]
    encs = [e for e in encs if e[5]]
    total = sum(e[5] for e in encs)
    if out is not None:
        if out.itemsize != width or len(out) != total or not out.flags.c_contiguous:
            raise ValueError(f"out holds {len(out)} x {out.itemsize} bytes, not {total} x {width}")
        out = out.view(dtype)
    if not encs:
        return np.zeros(0, dtype=dtype) if out is None else out
    delta = encs[0][0]
    ns = [e[5] for e in encs]
    stored = max(e[3] for e in encs)
    mask = (1 << 8 * width) - 1  # two's complement, modulo the width
    bases = [e[2] & mask for e in encs]
    firsts = [e[1] & mask for e in encs]
    if stored == 0 and not any(bases if delta else ()):  # constant in each chunk
        values = firsts if delta else bases
        if out is None:
            return np.repeat(np.array(values, dtype=dtype), ns)
        if min(values) == max(values):  # one pass, no full-size temporary
            out.fill(values[0])
        else:
            for a, n, value in zip(np.cumsum([0, *ns[:-1]]).tolist(), ns, values, strict=True):
                out[a : a + n] = value
        return out
    if out is None:
        out = np.zeros(total, dtype=dtype) if stored < width else np.empty(total, dtype=dtype)
    elif stored < width:
        out.fill(0)
    planes = out.view(np.uint8).reshape(total, width)
    lead = memoryview(bytes(1))[:delta]  # the first value's slot of a delta chunk
    zero = memoryview(bytes(max(ns)))
    for b in range(min(stored, width)):
        parts: list[Any] = []
        for e, n in zip(encs, ns, strict=True):
            m = n - delta
            parts += (lead, memoryview(e[4])[b * m : (b + 1) * m] if b < e[3] else zero[:m])
        planes[:, b] = np.frombuffer(b"".join(parts), dtype=np.uint8)
    starts = np.cumsum([0, *ns[:-1]])
    if any(bases):
        if min(bases) == max(bases):
            out += dtype(bases[0])
        else:
            pos = starts.tolist()
            for a, n, base in zip(pos, ns, bases, strict=True):
                if base:
                    out[a : a + n] += dtype(base)
        if delta:
            out[starts] = 0
    if not delta:
        return out
    sums = np.add.reduceat(out, starts, dtype=dtype)  # each chunk's deltas
    steps = np.array(firsts, dtype=dtype)
    steps[1:] -= steps[:-1] + sums[:-1]
    out[starts] = steps
    return np.cumsum(out, dtype=dtype, out=out)


@dataclass(frozen=True)
class ColumnAt:
    """A column left encoded (one encoding per chunk, in order): its values at a few records,
    from the chunks that hold them alone (a report reads a rank's first and last iteration,
    not the 80 MB of 10 M records)."""

    encs: list[Enc]
    dtype: np.dtype

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        ends = np.cumsum([e[5] for e in self.encs], dtype=np.int64)
        total = int(ends[-1]) if len(ends) else 0
        if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= total):
            raise IndexError(f"a record position outside 0..{total - 1}")
        chunk = np.searchsorted(ends, positions, side="right")
        out = np.empty(len(positions), dtype=self.dtype)
        for c in np.unique(chunk).tolist():
            mine = chunk == c
            values = decode_ints([self.encs[c]], self.dtype.itemsize).view(self.dtype)
            out[mine] = values[positions[mine] - (ends[c] - self.encs[c][5])]
        return out


def runs_of_chunks(records: list[int], count: int) -> list[tuple[int, int, int, int]]:
    """``count`` runs of chunks of about as many records each: (first chunk, end chunk, first
    record, end record). One long column on several threads: the widest (start_ns) alone
    was the columns' critical path on a host whose other threads had run out of columns."""
    ends = np.cumsum(records, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    cuts = sorted({0, len(records), *(int(np.searchsorted(ends, total * k // count)) + 1 for k in range(1, count))})
    cuts = [min(c, len(records)) for c in cuts]
    bounds = [0, *ends.tolist()]
    return [(a, b, bounds[a], bounds[b]) for a, b in pairwise(cuts) if b > a]
