"""Record batches of a user's job (``workers.monitor``): many ops and sizes in one stream.

Torch-free. The synthetic loop runs one collective of one size, so its
:class:`~workers.rank.publisher.RecordBatcher` fills ``op`` and ``nbytes`` with constants. A
user's job mixes all_reduce buckets, all_gathers and barriers of every size, so here each
row carries its own op, size and group size, and busbw uses the nccl-tests factor of
each row. The wire format is the same COLL batch: ops beyond ``protocol.COLLECTIVES``
get codes after them, named in order by ``OPS`` (sent in Hello.config["op_names"]).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.rank.publisher import NullPublisher, RecordBatcher, RecordPublisher
from workers.wire import protocol
from workers.wire.busbw import algbw_gbps, bus_factors
from workers.wire.protocol import COLL_COLUMNS, row_dtype

#: Every op the monitor names: protocol.COLLECTIVES first (same codes), then the others
#: (the schema's names, so reports and traces can name them too).
OPS: tuple[str, ...] = protocol.OP_NAMES
OP_INDEX: dict[str, int] = {name: i for i, name in enumerate(OPS)}

#: What a timer hands over per collective of a user's job; ``ranks``, the size of the process
#: group the op ran in (for busbw), is not on the wire.
MONITOR_COLL_ROW = row_dtype(
    COLL_COLUMNS,
    ("iteration", "step", "epoch", "mode", "op", "group", "dtype", "nbytes", "ranks", "host_ns", "start_ns", "dur_us"),
    extra={"ranks": "<i4"},
)


class MonitorBatcher(RecordBatcher):
    """A RecordBatcher whose collective rows carry their own op, size and group size."""

    def __init__(
        self,
        publisher: RecordPublisher | NullPublisher,
        status: Any,
        *,
        batch_ms: float,
        max_records: int = 4096,
    ) -> None:
        super().__init__(
            publisher, status, op_index=0, coll_nbytes=0, bus_factor=0.0, batch_ms=batch_ms, max_records=max_records
        )

        self.coll_arrays: list[np.ndarray] = []  # records that came as arrays (workers.capture)
        self.array_records = 0
        #: The highest iteration batched so far: an unrecorded one below it shows as a gap.
        self.top_iteration = -1

    def add_array(self, records: np.ndarray) -> None:
        """MONITOR_COLL_ROW records, sent with the next batch (in order, before that batch's rows)."""
        if len(records):
            self.coll_arrays.append(records)
            self.array_records += len(records)

    def full(self) -> bool:  # RecordBatcher.due asks it too
        return self.array_records >= self.max_records or super().full()

    def flush(self) -> None:
        if self.coll_arrays:
            arrays, self.coll_arrays, self.array_records = self.coll_arrays, [], 0
            if self.coll_rows:
                rows, self.coll_rows = self.coll_rows, []
                arrays.append(np.array(rows, dtype=MONITOR_COLL_ROW))
            arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            for i in range(0, len(arr), protocol.MAX_BATCH_RECORDS):
                part = arr[i : i + protocol.MAX_BATCH_RECORDS]
                self.publisher.publish(protocol.COLL, self.array_columns(part), len(part), self.status())
        super().flush()

    def coll_columns(self, rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
        return self.array_columns(np.array(rows, dtype=MONITOR_COLL_ROW))

    def array_columns(self, arr: np.ndarray) -> dict[str, np.ndarray]:
        if len(arr):
            self.top_iteration = max(self.top_iteration, int(arr["iteration"].max()))
        algbw = algbw_gbps(arr["nbytes"], arr["dur_us"])
        busbw = algbw * bus_factors(arr["op"], arr["ranks"])
        cols = {name: arr[name] for name in COLL_COLUMNS if name not in ("algbw", "busbw")}
        cols["algbw"] = algbw.astype(np.float32)
        cols["busbw"] = busbw.astype(np.float32)
        return cols
