"""Decode CUPTI MEMCPY activity records into commtop copy rows (torch-free, CUPTI-free).

A record is read as the few fields commtop needs, :data:`FIELDS` (``copy_kind``,
``src_kind``, ``dst_kind``, ``bytes``, ``start``, ``end``), gathered from CUPTI's buffers by
:mod:`workers.rank.cupti_activity`. Device-to-device copies are not offloads (at world size 1
NCCL's own collectives are DtoD copies), so only DtoH and HtoD become rows.

CUPTI timestamps are in nanoseconds of CUPTI's clock; :class:`ClockMap` maps them to
``time.time_ns()`` from pairs read back to back (on the H200 with driver 580 the two
clocks differed by ~8 us and drifted ~3 us over a second, see the fixture's clock_pairs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workers.rank.cupti_activity import MEMCPY_DTOH, MEMCPY_HTOD, MEMORY_PINNED

#: Fields read from each record (the names of cupti.ActivityMemcpy6's attributes).
FIELDS = ("copy_kind", "src_kind", "dst_kind", "bytes", "start", "end")


@dataclass(frozen=True)
class CopyRecord:
    direction: str  # "d2h" or "h2d" (workers.wire.protocol.DIRECTIONS)
    pinned: bool
    nbytes: int
    start_ns: int  # on time.time_ns()
    dur_us: float

    @property
    def gbps(self) -> float:
        return self.nbytes / (self.dur_us * 1e3) if self.dur_us > 0 else 0.0


class ClockMap:
    """CUPTI timestamp -> time.time_ns(), offset from the newest (cupti_ns, time_ns) pair."""

    def __init__(self, offset_ns: int = 0) -> None:
        self.offset_ns = offset_ns

    @classmethod
    def from_pairs(cls, pairs: Iterable[Mapping[str, int]]) -> ClockMap:
        offsets = sorted(int(p["time_ns"]) - int(p["cupti_ns"]) for p in pairs)
        return cls(offsets[len(offsets) // 2] if offsets else 0)

    def update(self, cupti_ns: int, time_ns: int) -> None:
        self.offset_ns = time_ns - cupti_ns

    def to_time_ns(self, cupti_ns: int) -> int:
        return cupti_ns + self.offset_ns


def decode_copy(fields: tuple[int, int, int, int, int, int], clock: ClockMap) -> CopyRecord | None:
    """A DtoH/HtoD copy as a CopyRecord; None for other kinds and for unfinished records."""
    kind, src, dst, nbytes, start, end = fields
    if kind == MEMCPY_DTOH:
        direction, host = "d2h", dst
    elif kind == MEMCPY_HTOD:
        direction, host = "h2d", src
    else:
        return None
    if end <= start or start <= 0:
        return None
    return CopyRecord(direction, host == MEMORY_PINNED, nbytes, clock.to_time_ns(start), (end - start) / 1e3)
