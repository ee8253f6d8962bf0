"""One read of the Flight Recorder ring as columns: what a decoder hands the capture thread.

A read's new collectives travel as one numpy structured array (:data:`FR_ROW`, 27 bytes a
collective) plus the groups they name and the cursor's state after the read, so the rank turns
them into records with a few vector operations and no Python object per collective. The same
batch comes from the decoder in the rank (:class:`workers.capture.fr_source.LocalDecoder`) and
from the one in a child process (:mod:`workers.capture.fr_child`), where it crosses a pipe as
one frame (:func:`encode`, :func:`decode`): header length, array length, JSON header, array.

Torch-free; numpy only.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.capture.flight_recorder import FrCollective, FrCursor
from workers.wire.protocol import COLL_COLUMNS, OP_NAMES

#: op name -> its code (workers.monitor.records.OP_INDEX, without importing the publisher).
OP_INDEX: dict[str, int] = {name: i for i, name in enumerate(OP_NAMES)}

#: A collective as it leaves a decoder; ``group`` indexes the batch's ``groups``.
FR_ROW = np.dtype(
    [
        ("op", COLL_COLUMNS["op"]),
        ("group", "<u2"),
        ("dtype", COLL_COLUMNS["dtype"]),
        ("nbytes", COLL_COLUMNS["nbytes"]),
        ("ranks", "<i4"),
        ("host_ns", COLL_COLUMNS["host_ns"]),
        ("dur_us", COLL_COLUMNS["dur_us"]),
    ]
)
#: A frame's two lengths (header, array), little-endian.
_LENGTHS = struct.Struct("<II")
#: Largest header and array a frame may carry (a ring of 1 M entries fits).
MAX_HEADER = 1 << 24
MAX_ARRAY = (1 << 20) * FR_ROW.itemsize

#: (torch's group name, its description, its size): how the rank's group table keys a group.
GroupKey = tuple[str, str, int]


@dataclass
class FrBatch:
    """New collectives of one read, the groups ``rows["group"]`` points into, the cursor after the
    read (:meth:`FrCursor.state`), and how many entries the dump held; ``error`` when a child
    decoder could not read (then the rest is empty)."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, FR_ROW))
    groups: list[GroupKey] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    held: int = 0
    error: str = ""

    def __len__(self) -> int:
        return len(self.rows)


def batch_of(collectives: Sequence[FrCollective], cursor: FrCursor, held: int) -> FrBatch:
    """The batch of a decoded read (in the process that decoded it)."""
    codes: dict[str, int] = {}
    groups: list[GroupKey] = []
    rows = np.zeros(len(collectives), FR_ROW)
    if collectives:
        group_col = []
        for c in collectives:
            i = codes.get(c.pg)
            if i is None:
                i = codes[c.pg] = len(groups)
                groups.append((c.pg, c.desc, c.ranks))
            group_col.append(i)
        rows["op"] = [OP_INDEX[c.op] for c in collectives]
        rows["group"] = group_col
        rows["dtype"] = [c.dtype for c in collectives]
        rows["nbytes"] = [c.nbytes for c in collectives]
        rows["ranks"] = [c.ranks for c in collectives]
        rows["host_ns"] = [c.host_ns for c in collectives]
        rows["dur_us"] = [c.dur_us for c in collectives]
    return FrBatch(rows, groups, cursor.state(), held)


def encode(batch: FrBatch) -> bytes:
    """One frame: the lengths, the JSON header, the array's bytes."""
    header = json.dumps(
        {"groups": batch.groups, "state": batch.state, "held": batch.held, "n": len(batch.rows), "error": batch.error},
        separators=(",", ":"),
    ).encode()
    array = np.ascontiguousarray(batch.rows, FR_ROW).tobytes()
    return _LENGTHS.pack(len(header), len(array)) + header + array


def frame_lengths(prefix: bytes) -> tuple[int, int]:
    """(header, array) lengths from a frame's first 8 bytes; ValueError beyond the limits."""
    header, array = _LENGTHS.unpack(prefix)
    if header > MAX_HEADER or array > MAX_ARRAY or array % FR_ROW.itemsize:
        raise ValueError(f"not a Flight Recorder frame (header {header} B, array {array} B)")
    return header, array


PREFIX = _LENGTHS.size


def decode(frame: bytes) -> FrBatch:
    """A frame back into a batch; ValueError for anything :func:`encode` does not write."""
    if len(frame) < PREFIX:
        raise ValueError(f"a Flight Recorder frame of {len(frame)} bytes is too short")
    hlen, alen = frame_lengths(frame[:PREFIX])
    if len(frame) != PREFIX + hlen + alen:
        raise ValueError(f"a Flight Recorder frame of {len(frame)} bytes, not {PREFIX + hlen + alen}")
    try:
        head = json.loads(frame[PREFIX : PREFIX + hlen])
        groups = [(str(n), str(d), int(s)) for n, d, s in head["groups"]]
        n, held, error, state = int(head["n"]), int(head["held"]), str(head["error"]), dict(head["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a Flight Recorder frame's header is unreadable: {exc!r}") from exc
    rows = np.frombuffer(frame, FR_ROW, count=alen // FR_ROW.itemsize, offset=PREFIX + hlen)
    if len(rows) != n:
        raise ValueError(f"a Flight Recorder frame says {n} collectives and holds {len(rows)}")
    if n and int(rows["group"].max()) >= len(groups):
        raise ValueError("a Flight Recorder frame names a group it does not list")
    return FrBatch(rows, groups, state, held, error)
