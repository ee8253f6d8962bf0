"""Decode torch's Flight Recorder dumps into commtop collective rows (torch-free).

A dump (``torch._C._distributed_c10d._dump_nccl_trace``, unpickled) holds ``entries``: one
dict per collective with ``record_id`` (global, increasing), ``pg_id``/``process_group``,
``profiling_name`` ("nccl:_all_gather_base"), ``input_sizes``/``input_dtypes``,
``output_sizes``/``output_dtypes``, ``state`` ("scheduled"/"started"/"completed"),
``time_created_ns`` (host enqueue, wall clock) and, with collective timing on
(``TORCH_NCCL_ENABLE_TIMING=1``), ``duration_ms`` measured by CUDA events on the NCCL stream.

The ring keeps the last N entries whatever has been read, so :class:`FrCursor` remembers what
it emitted and returns only new, finished entries; entries overwritten before a dump read
them are counted as ``lost``. Bytes follow nccl-tests' S (total gathered size for all_gather,
total input for reduce_scatter), as :mod:`workers.monitor.patch` does, so busbw compares.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: any class or function a pickle
    names is refused, so loading a dump can never run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump names {module}.{name}: refused (plain data only)")


def load_dump(raw: bytes) -> dict[str, Any]:
    """A Flight Recorder dump (the bytes torch's dump API returns) as plain data; raises
    pickle.UnpicklingError for anything but plain data (torch 2.11's dumps are plain data)."""
    data = _PlainData(io.BytesIO(raw)).load()
    if not isinstance(data, dict):
        raise pickle.UnpicklingError(f"a Flight Recorder dump is a map, not {type(data).__name__}")
    return data


#: c10 ScalarType names as Flight Recorder writes them -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
}

#: Flight Recorder op names (after "nccl:"/"gloo:" and leading underscores) -> commtop op names.
OP_OF: dict[str, str] = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "all_reduce_barrier": "barrier",
    "barrier": "barrier",
}


@dataclass(frozen=True)
class FrCollective:
    """One finished, timed collective of a dump."""

    record_id: int
    pg: str  # process group name (Flight Recorder's pg_config key)
    seq: int  # collective_seq_id within its group
    op: str  # commtop op name (workers.monitor.records.OPS)
    nbytes: int  # nccl-tests S
    ranks: int  # size of the process group
    host_ns: int  # time_created_ns: when the rank enqueued it (wall clock)
    dur_us: float  # CUDA events on the NCCL stream


def op_name(profiling_name: str) -> str | None:
    """'nccl:_all_gather_base' -> 'all_gather'; None for point-to-point and unknown ops."""
    name = profiling_name.split(":", 1)[-1].lstrip("_")
    return OP_OF.get(name)


def _bytes(sizes: Any, dtypes: Any) -> int:
    total = 0
    for shape, dtype in zip(sizes or (), dtypes or (), strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * DTYPE_BYTES.get(str(dtype), 0)
    return total


def entry_nbytes(op: str, entry: Mapping[str, Any]) -> int:
    """nccl-tests S of one entry: the gathered output for all_gather, the input otherwise."""
    if op == "barrier":
        return 0
    if op == "all_gather":
        return _bytes(entry.get("output_sizes"), entry.get("output_dtypes") or entry.get("input_dtypes"))
    return _bytes(entry.get("input_sizes"), entry.get("input_dtypes"))


def group_sizes(dump: Mapping[str, Any]) -> dict[str, int]:
    """pg name -> number of ranks, from ``pg_config`` ("ranks": "[0, 1, 2]")."""
    out: dict[str, int] = {}
    for name, cfg in (dump.get("pg_config") or {}).items():
        ranks = str(cfg.get("ranks", "")).strip("[] ")
        out[str(name)] = len([r for r in ranks.split(",") if r.strip()]) if ranks else 0
    return out


class FrCursor:
    """Reads successive dumps of the same ring: each finished entry is returned once.

    ``lost``: entries the ring overwrote before a dump saw them finished. ``untimed``:
    finished entries without ``duration_ms`` (a group whose timing is off). ``skipped``:
    point-to-point and unknown ops (commtop's rows name collectives only). A finished entry
    gets its ``duration_ms`` when torch's watchdog retires it (``retired``), so finished but
    unretired entries wait for a later dump (seen on the H200: read too early, 52 of 252
    collectives of a DDP run came out untimed).
    """

    def __init__(self) -> None:
        self.watermark = -1  # every record_id <= this was handled
        self._done: set[int] = set()  # handled ids above the watermark
        self.lost = 0
        self.untimed = 0
        self.skipped = 0
        self.pending = 0  # entries of the last dump still running or not retired yet
        self._sizes: dict[str, int] = {}

    def read(self, dump: Mapping[str, Any]) -> list[FrCollective]:
        """New finished collectives of ``dump`` in record order."""
        self._sizes.update(group_sizes(dump))
        entries = sorted(
            (e for e in dump.get("entries") or () if int(e.get("record_id", -1)) > self.watermark),
            key=lambda e: int(e["record_id"]),
        )
        if entries:
            first = int(entries[0]["record_id"])
            if first > self.watermark + 1:
                missing = range(self.watermark + 1, first)
                self.lost += sum(1 for rid in missing if rid not in self._done)
                self._done.difference_update(missing)
                self.watermark = first - 1
        out: list[FrCollective] = []
        self.pending = 0
        for e in entries:
            rid = int(e["record_id"])
            if rid in self._done:
                continue
            if e.get("state") != "completed" or (e.get("duration_ms") is None and not e.get("retired", True)):
                self.pending += 1  # running, or finished but its duration not read yet (the watchdog retires it)
                continue
            row = self._row(e)
            if row is not None:
                out.append(row)
            self._done.add(rid)
        self._advance()
        return out

    def _row(self, e: Mapping[str, Any]) -> FrCollective | None:
        op = op_name(str(e.get("profiling_name", "")))
        if op is None or e.get("is_p2p"):
            self.skipped += 1
            return None
        duration = e.get("duration_ms")
        if duration is None:
            self.untimed += 1
            return None
        pg = e.get("process_group") or (str(e.get("pg_id", "")), "")
        name = str(pg[0])
        return FrCollective(
            record_id=int(e["record_id"]),
            pg=name,
            seq=int(e.get("collective_seq_id", -1)),
            op=op,
            nbytes=entry_nbytes(op, e),
            ranks=self._sizes.get(name, 0),
            host_ns=int(e.get("time_created_ns") or 0),
            dur_us=float(duration) * 1e3,
        )

    def _advance(self) -> None:
        done = self._done
        w = self.watermark
        while w + 1 in done:
            w += 1
            done.discard(w)
        self.watermark = w


def read_all(dumps: Iterable[Mapping[str, Any]]) -> tuple[list[FrCollective], FrCursor]:
    """Every new finished collective of successive dumps (tests, offline decoding)."""
    cursor = FrCursor()
    rows: list[FrCollective] = []
    for d in dumps:
        rows.extend(cursor.read(d))
    return rows, cursor
